"""Authoring in the browser's forms: create and edit an experiment with its arms, submit runs,
cancel a run. The same services as the API, so the same refusals, each naming the field; every
form is one transaction."""

from decimal import Decimal

import pytest
from django.urls import reverse

from apps.dashboard.views_authoring import strategy_examples
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.strategies import strategy_sha256
from tests.apps.dashboard.world import run_of, world

pytestmark = pytest.mark.django_db

GOOD = "model: {family: llama, preset: tiny, seq_len: 64}\ntrain: {steps: 3, global_batch: 2}\n"
GOOD_4 = GOOD.replace("steps: 3", "steps: 4")
BAD = "model: {family: llama, preset: tiny, seq_len: 64}\ntrain: {steps: 0}\n"


def form_data(
    w, *, name="browser-made", arms=(("fp32", GOOD, True), ("bf16", GOOD_4, False)), **extra
):
    data = {
        "tenant": w.experiment.tenant.slug,
        "name": name,
        "description": "",
        "status": "active",
        "cost_model": w.experiment.cost_model_id,
        "pricing_table": "",
        "freeze_threshold": "0.05",
        "alpha": "0.05",
        "attribution_interval_s": "30",
        "min_runs_per_arm": "3",
        "min_samples_per_arm": "30",
        "min_cs_runs_per_arm": "10",
        "freeze_policy": "let_finish",
        "dynamic_weights": "on",
        "target_steps": "",
        "arms-TOTAL_FORMS": str(len(arms)),
        "arms-INITIAL_FORMS": "0",
        "arms-MIN_NUM_FORMS": "0",
        "arms-MAX_NUM_FORMS": "12",
    }
    for i, (arm_name, yaml, control) in enumerate(arms):
        data.update(
            {f"arms-{i}-name": arm_name, f"arms-{i}-strategy_yaml": yaml, f"arms-{i}-weight": "1"}
        )
        if control:
            data[f"arms-{i}-is_control"] = "on"
    data.update(extra)
    return data


def test_the_list_has_a_create_button_and_the_form_offers_the_example_strategies(member, w):
    page = member.get(reverse("dashboard:experiments")).content.decode()
    assert reverse("dashboard:experiment-new") in page
    response = member.get(reverse("dashboard:experiment-new"))
    assert response.status_code == 200
    body = response.content.decode()
    examples = strategy_examples()
    assert {"tiny", "bf16-fused"} <= set(examples)
    for name in examples:
        assert f'<option value="{name}">' in body
    assert 'id="strategy-examples"' in body and "<script>" not in body.replace("<script src=", "")
    assert reverse("api:arm-validate-strategy") in body


def test_create_an_experiment_with_two_arms(member, w):
    crlf = GOOD.replace("\n", "\r\n").rstrip("\r\n")  # as a browser's textarea sends it
    response = member.post(
        reverse("dashboard:experiment-new"),
        form_data(w, arms=(("fp32", crlf, True), ("bf16", GOOD_4, False))),
    )
    experiment = Experiment.objects.get(name="browser-made")
    assert response.status_code == 302 and response["Location"] == reverse(
        "dashboard:experiment", args=[experiment.pk]
    )
    assert experiment.tenant == w.experiment.tenant and experiment.status == "active"
    control, candidate = experiment.arms.order_by("-is_control")
    assert (control.name, control.is_control, candidate.name) == ("fp32", True, "bf16")
    assert control.strategy_yaml == GOOD, "normalised: LF line endings, one final newline"
    assert control.strategy_sha256 == strategy_sha256(GOOD)
    follow = member.get(response["Location"]).content.decode()
    assert "created" in follow, "the next page says what happened"


def test_a_bad_strategy_names_the_key_and_nothing_is_saved(member, w):
    response = member.post(
        reverse("dashboard:experiment-new"),
        form_data(w, arms=(("fp32", GOOD, True), ("broken", BAD, False))),
    )
    assert response.status_code == 400
    errors = response.context["arms"].forms[1].errors
    assert any("train.steps" in e for e in errors["strategy_yaml"]), errors
    assert not Experiment.objects.filter(name="browser-made").exists(), (
        "the experiment was rolled back with its arm"
    )
    assert not Arm.objects.filter(name="fp32").exists()


def test_a_taken_name_and_two_controls_are_refused_naming_the_field(member, w):
    response = member.post(
        reverse("dashboard:experiment-new"), form_data(w, name=w.experiment.name)
    )
    assert response.status_code == 400
    assert any(
        "already has an experiment named" in e for e in response.context["form"].errors["name"]
    )
    response = member.post(
        reverse("dashboard:experiment-new"),
        form_data(w, arms=(("a", GOOD, True), ("b", GOOD, True))),
    )
    assert response.status_code == 400
    assert any(e.startswith("is_control:") for e in response.context["arms"].non_form_errors())
    response = member.post(
        reverse("dashboard:experiment-new"), form_data(w, arms=(("", "", False),))
    )
    assert response.context["arms"].errors[0]["name"] == ["name: This field is required."]
    assert response.context["arms"].errors[0]["strategy_yaml"] == [
        "strategy_yaml: This field is required."
    ]
    response = member.post(reverse("dashboard:experiment-new"), form_data(w, arms=()))
    assert any(e.startswith("arms:") for e in response.context["arms"].non_form_errors())
    assert Experiment.objects.count() == 1


def test_edit_an_experiment_moves_the_control_and_changes_a_strategy(member, w):
    url = reverse("dashboard:experiment-edit", args=[w.experiment.pk])
    form = member.get(url).context["arms"]
    assert [f.initial["name"] for f in form.forms[:2]] == ["baseline", "optimized"]
    data = form_data(
        w,
        name="renamed",
        arms=(("baseline", GOOD, False), ("optimized", GOOD, True)),
        **{
            "arms-INITIAL_FORMS": "2",
            "arms-0-arm_id": str(w.control.pk),
            "arms-1-arm_id": str(w.candidate.pk),
        },
    )
    data.pop("tenant")
    response = member.post(url, data)
    assert response.status_code == 302, response.context and response.context["form"].errors
    w.control.refresh_from_db()
    w.candidate.refresh_from_db()
    assert (w.control.is_control, w.candidate.is_control) == (False, True)
    assert w.control.strategy_yaml == GOOD and w.control.revision == 2
    assert Experiment.objects.get(pk=w.experiment.pk).name == "renamed"


def test_edit_refuses_an_arm_of_another_experiment(member, w):
    other = world()
    data = form_data(
        w,
        arms=(("x", GOOD, True),),
        **{"arms-INITIAL_FORMS": "1", "arms-0-arm_id": str(other.control.pk)},
    )
    data.pop("tenant")
    response = member.post(reverse("dashboard:experiment-edit", args=[w.experiment.pk]), data)
    assert response.status_code == 400
    assert any("arm_id" in e for e in response.context["arms"].forms[0].non_field_errors())
    other.control.refresh_from_db()
    assert other.control.name == "baseline"


def test_submit_n_runs_to_one_arm_or_by_weight(member, w):
    url = reverse("dashboard:runs-new", args=[w.experiment.pk])
    response = member.post(url, {"count": "3", "arm": str(w.candidate.pk), "git_sha": "ABC123"})
    assert response.status_code == 302
    runs = Run.objects.filter(experiment=w.experiment)
    assert runs.count() == 3 and {r.arm_id for r in runs} == {w.candidate.pk}
    assert {r.git_sha for r in runs} == {"ABC123"} and {r.status for r in runs} == {"queued"}
    assert member.post(url, {"count": "1"}).status_code == 302
    assert Run.objects.filter(experiment=w.experiment).count() == 4


def test_a_submission_over_the_quota_queues_none_and_says_why(member, w):
    tenant = w.experiment.tenant
    tenant.max_concurrent_runs = 2
    tenant.save()
    response = member.post(reverse("dashboard:runs-new", args=[w.experiment.pk]), {"count": "3"})
    assert response.status_code == 400
    [error] = response.context["form"].errors["count"]
    assert (
        "none of the 3 runs was queued" in error
        and "max_concurrent_runs" in error
        and "limit 2" in error
    )
    assert not Run.objects.exists()
    response = member.post(reverse("dashboard:runs-new", args=[w.experiment.pk]), {"count": "99"})
    assert response.status_code == 400
    assert response.context["form"].errors["count"] == [
        "count: Ensure this value is less than or equal to 20."
    ]


def test_a_frozen_arm_is_not_offered(member, w):
    Arm.objects.filter(pk=w.candidate.pk).update(state="frozen", weight=Decimal(0))
    response = member.post(
        reverse("dashboard:runs-new", args=[w.experiment.pk]),
        {"count": "1", "arm": str(w.candidate.pk)},
    )
    assert response.status_code == 400 and "arm" in response.context["form"].errors


def test_cancel_a_queued_run_and_refuse_a_finished_one(member, w):
    queued = run_of(w.control, status=Run.Status.QUEUED)
    response = member.post(reverse("dashboard:run-cancel", args=[queued.pk]), {"next": "/runs/"})
    assert response.status_code == 302 and response["Location"] == "/runs/"
    queued.refresh_from_db()
    assert queued.status == "cancelled"
    done = run_of(w.control)
    response = member.post(
        reverse("dashboard:run-cancel", args=[done.pk]), {"next": "https://evil.example/"}
    )
    assert response["Location"] == reverse("dashboard:run", args=[done.pk]), (
        "never an off-site redirect"
    )
    page = member.get(response["Location"]).content.decode()
    assert "already succeeded" in page
    assert member.get(reverse("dashboard:run-cancel", args=[done.pk])).status_code == 405


def test_another_teams_experiment_and_run_are_404(member, w):
    other = world()
    run = run_of(other.control, status=Run.Status.QUEUED)
    assert (
        member.get(reverse("dashboard:experiment-edit", args=[other.experiment.pk])).status_code
        == 404
    )
    assert (
        member.post(
            reverse("dashboard:runs-new", args=[other.experiment.pk]), {"count": "1"}
        ).status_code
        == 404
    )
    assert member.post(reverse("dashboard:run-cancel", args=[run.pk])).status_code == 404
    run.refresh_from_db()
    assert run.status == "queued"


def test_edit_deletes_an_arm_without_runs_and_refuses_one_with_runs(member, w):
    url = reverse("dashboard:experiment-edit", args=[w.experiment.pk])
    base = form_data(
        w,
        name=w.experiment.name,
        arms=(("baseline", GOOD, True), ("optimized", GOOD, False)),
        **{
            "arms-INITIAL_FORMS": "2",
            "arms-0-arm_id": str(w.control.pk),
            "arms-1-arm_id": str(w.candidate.pk),
        },
    )
    base.pop("tenant")
    run_of(w.control)
    response = member.post(url, {**base, "arms-0-DELETE": "on"})
    assert response.status_code == 400
    assert any("has 1 runs" in e for e in response.context["arms"].forms[0].non_field_errors())
    assert Arm.objects.filter(pk=w.control.pk).exists()
    response = member.post(url, {**base, "arms-1-DELETE": "on", "arms-1-strategy_yaml": ""})
    assert response.status_code == 302, "a deleted arm's fields are not checked"
    assert list(w.experiment.arms.values_list("name", flat=True)) == ["baseline"]


def sweep_data(w, **overrides):
    return {
        "tenant": w.experiment.tenant.slug,
        "name": "batch x dtype",
        "base_strategy_yaml": GOOD,
        "space": '{"train.global_batch": [1, 2], "model.seq_len": [16, 32]}',
        "objectives": ["usd_per_mtok"],
        "sampler": "auto",
        "probe_count": "4",
        "probe_steps": "4",
        "warmup_steps": "1",
        "parallelism": "2",
        "seed": "0",
        **overrides,
    }


def test_start_a_sweep_from_the_browser(member, w):
    from apps.sweeps.models import Sweep

    assert (
        reverse("dashboard:sweep-new") in member.get(reverse("dashboard:sweeps")).content.decode()
    )
    form = member.get(reverse("dashboard:sweep-new"))
    assert form.status_code == 200 and 'id="strategy-examples"' in form.content.decode()
    response = member.post(reverse("dashboard:sweep-new"), sweep_data(w))
    sweep = Sweep.objects.get(name="batch x dtype")
    assert response.status_code == 302 and response["Location"] == reverse(
        "dashboard:sweep", args=[sweep.pk]
    )
    assert (
        sweep.tenant == w.experiment.tenant
        and sweep.sampler == "grid"
        and sweep.objectives == ["usd_per_mtok"]
    )
    assert sweep.probes.count() == 2, "the first probes (parallelism 2) are queued"


def test_a_sweep_refused_names_the_field_and_key(member, w):
    from apps.sweeps.models import Sweep

    response = member.post(
        reverse("dashboard:sweep-new"), sweep_data(w, space='{"train.bogus": [1]}')
    )
    assert response.status_code == 400
    assert any("space.train.bogus" in e for e in response.context["form"].errors["space"])
    response = member.post(
        reverse("dashboard:sweep-new"), sweep_data(w, space="{not json", probe_count="0")
    )
    errors = response.context["form"].errors
    assert errors["space"][0].startswith("space: ") and errors["probe_count"][0].startswith(
        "probe_count: "
    )
    response = member.post(reverse("dashboard:sweep-new"), sweep_data(w, base_strategy_yaml=BAD))
    assert any("train.steps" in e for e in response.context["form"].errors["base_strategy_yaml"])
    assert not Sweep.objects.exists()


def test_an_experiments_tags_are_set_on_its_form_and_shown_on_its_page(member, w):
    from apps.experiments.services import experiment_update

    experiment_update(experiment=w.experiment, tags="q4, tokenizer")
    w.experiment.refresh_from_db()
    assert w.experiment.tags == "q4,tokenizer"
    page = member.get(reverse("dashboard:experiment", args=[w.experiment.pk])).content.decode()
    assert '<span class="tag">q4</span>' in page and '<span class="tag">tokenizer</span>' in page
    form = member.get(reverse("dashboard:experiment-edit", args=[w.experiment.pk])).content.decode()
    assert 'name="tags"' in form
