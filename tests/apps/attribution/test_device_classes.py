"""Arms compare within one device class: a candidate that wins on one CPU and loses on another
gets one verdict per class, the tick freezes on the reference class alone, and runs on a class
where the control has none are counted and said, never mixed in."""

from __future__ import annotations

import pytest

from apps.attribution.models import AttributionSnapshot, AttributionWindow, FreezeEvent
from apps.attribution.say.report import experiment_report
from apps.attribution.say.snapshots import COMPARED_FIELDS, window_recompute
from tests.apps.attribution.lab import Lab

pytestmark = pytest.mark.django_db

AMX = "cpu:Intel(R) Xeon(R) Platinum 8481C|amx_bf16,avx2,avx512_bf16,avx512f"
AVX2 = "cpu:AMD EPYC 7B13|avx2"
ARM64 = "cpu:Neoverse-V2|bf16"


def two_class_lab(runs: int = 10) -> Lab:
    """bf16 on both CPUs: 40 % cheaper on the AMX host, 3x dearer where it is emulated."""
    lab = Lab(
        {"control": 1.0, "candidate": 1.0},
        runs_per_arm=0,
        noise=0.01,
        seed=7,
        min_runs_per_arm=3,
        min_samples_per_arm=10,
    )
    for _ in range(runs):  # the control's first run is on the AMX host: the reference class
        lab.add_run(lab.arms["control"], device_class=AMX)
        lab.add_run(lab.arms["candidate"], device_class=AMX, factor=0.6)
        lab.add_run(lab.arms["control"], device_class=AVX2)
        lab.add_run(lab.arms["candidate"], device_class=AVX2, factor=3.0)
    return lab


def latest(lab: Lab, arm: str) -> AttributionSnapshot:
    return AttributionSnapshot.objects.filter(arm=lab.arms[arm]).order_by("-window__number").first()


def test_the_candidate_wins_on_one_class_and_loses_on_the_other_one_verdict_each(settings):
    settings.COSTLAB_CS_MIN_RUNS = 5
    lab = two_class_lab()
    lab.run_ticks(4)

    snap = latest(lab, "candidate")
    # The tick compares within the reference class: 40 % cheaper, not the mixture (~ +80 %).
    assert snap.deviation == pytest.approx(-0.4, abs=0.03)
    assert snap.runs == 10 and latest(lab, "control").runs == 10
    assert snap.evidence["device_class"] == AMX
    assert snap.evidence["other_device_classes"] == [
        {"device_class": AVX2, "label": "AMD EPYC 7B13 (avx2)", "runs": 10}
    ]
    # Its 3x loss on the AVX2 host freezes nothing: the freeze rule sees one class.
    assert not FreezeEvent.objects.filter(arm=lab.arms["candidate"]).exists()

    report = experiment_report(experiment=lab.experiment)
    assert report.device_class == AMX
    amx, avx2 = report.device_classes
    assert (amx.device_class, amx.reference, avx2.device_class, avx2.reference) == (
        AMX,
        True,
        AVX2,
        False,
    )
    cand = {c.device_class: next(a for a in c.arms if a.name == "candidate") for c in (amx, avx2)}
    assert cand[AMX].verdict == "cheaper" and cand[AMX].deviation == pytest.approx(-0.4, abs=0.03)
    assert cand[AVX2].verdict == "costlier" and cand[AVX2].deviation == pytest.approx(2.0, abs=0.1)
    assert cand[AVX2].deviation_low > 0.05  # always-valid bounds clear the threshold
    assert "compared within this class only" in avx2.note
    # The main verdict is the reference class's.
    main = next(a for a in report.arms if a.name == "candidate")
    assert main.deviation == pytest.approx(cand[AMX].deviation)
    assert main.runs == 20  # the bill counts every run, on every class


def test_a_class_the_control_never_ran_on_is_counted_and_said_not_compared(settings):
    settings.COSTLAB_CS_MIN_RUNS = 5
    lab = two_class_lab(runs=6)
    for _ in range(4):
        lab.add_run(lab.arms["candidate"], device_class=ARM64, factor=0.1)
    lab.run_ticks(3)
    snap = latest(lab, "candidate")
    assert {c["device_class"]: c["runs"] for c in snap.evidence["other_device_classes"]} == {
        AVX2: 6,
        ARM64: 4,
    }
    assert snap.deviation == pytest.approx(-0.4, abs=0.04)  # the 10x-cheaper runs are not mixed in
    arm64 = next(
        c
        for c in experiment_report(experiment=lab.experiment).device_classes
        if c.device_class == ARM64
    )
    assert arm64.control_runs == 0 and arm64.runs == 4
    assert "the control has no runs on this device class" in arm64.note
    assert {a.name: a.verdict for a in arm64.arms} == {"control": "control", "candidate": "no_data"}


def test_a_recompute_reproduces_the_class_the_tick_compared_within(settings):
    settings.COSTLAB_CS_MIN_RUNS = 5
    lab = two_class_lab(runs=6)
    lab.run_ticks(2)
    window = AttributionWindow.objects.get(experiment=lab.experiment, number=2)
    stored = {s.arm_id: s for s in window.snapshots.all()}
    for again in window_recompute(window=window):
        for name in COMPARED_FIELDS:
            assert getattr(again, name) == getattr(stored[again.arm_id], name), name


def test_one_class_reads_as_before():
    lab = Lab({"control": 1.0, "b": 0.9}, runs_per_arm=6, seed=3)
    lab.run_ticks(2)
    report = experiment_report(experiment=lab.experiment)
    [only] = report.device_classes
    assert only.reference and only.note == "" and report.device_class == ""
    b = next(a for a in report.arms if a.name == "b")
    assert next(a for a in only.arms if a.name == "b").deviation == b.deviation
    assert latest(lab, "b").evidence["other_device_classes"] == []


def test_the_card_and_the_api_name_the_class_and_give_one_verdict_per_class(settings, client):
    from django.urls import reverse
    from rest_framework.test import APIClient

    from apps.api.services import api_token_create
    from tests.factories import MembershipFactory, UserFactory

    settings.COSTLAB_CS_MIN_RUNS = 5
    lab = two_class_lab()
    lab.run_ticks(4)
    user = UserFactory(username="dana")
    MembershipFactory(tenant=lab.experiment.tenant, user=user, role="member")
    client.force_login(user)
    page = client.get(reverse("dashboard:experiment", args=[lab.experiment.pk])).content.decode()
    assert 'id="verdict-device"' in page and "Intel(R) Xeon(R) Platinum 8481C" in page
    candidate = lab.arms["candidate"].pk
    assert f'data-arm="{candidate}" data-verdict="cheaper"' in page
    assert f'data-arm="{candidate}" data-verdict="costlier"' in page
    assert "AMD EPYC 7B13 (avx2)" in page
    classes = page.split('id="verdict-classes"')[1].split("</table>")[0]
    assert "% cheaper" in classes and "% dearer" in classes, "in words, as the card (issue 44)"

    _token, secret = api_token_create(tenant=lab.experiment.tenant, name="ci")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    body = api.get(f"/api/v1/experiments/{lab.experiment.pk}/report/").json()
    assert body["device_class"] == AMX
    verdicts = {
        c["device_class"]: {a["name"]: a["verdict"] for a in c["arms"]}
        for c in body["device_classes"]
    }
    assert verdicts == {
        AMX: {"control": "control", "candidate": "cheaper"},
        AVX2: {"control": "control", "candidate": "costlier"},
    }
    assert next(a for a in body["arms"] if a["name"] == "candidate")["verdict"] == "cheaper"
