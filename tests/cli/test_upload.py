"""`costlab upload FILE.jsonl` against a live server: a historical run priced at the prices of its
own time, bad lines refused before anything is sent, the window's bounds, and an interrupted
upload that resumes."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.experiments.models import ArmAssignment, Run
from apps.telemetry.models import TelemetrySample
from tests.cli.conftest import cli
from tests.factories import GpuPriceFactory, GpuSkuFactory, PricingTableFactory

pytestmark = pytest.mark.slow

NOW = timezone.now().replace(microsecond=0)
START = NOW - timedelta(days=2)  # the run trained two days ago
OLD = {"gpu": Decimal("2.00"), "kwh": Decimal("0.15"), "pue": Decimal("1.20")}  # 0.056485 USD
NEW = {"gpu": Decimal("5.00"), "kwh": Decimal("0.30"), "pue": Decimal("1.50")}


@pytest.fixture
def sku(lab):
    """Two price versions: the one in force two days ago, and today's (dearer) from yesterday."""
    sku = GpuSkuFactory(name="Test H100")
    tenant = lab["experiment"].tenant
    for prices, valid_from in ((OLD, NOW - timedelta(days=10)), (NEW, NOW - timedelta(days=1))):
        table = PricingTableFactory(
            tenant=tenant,
            valid_from=valid_from,
            electricity_usd_per_kwh=prices["kwh"],
            pue=prices["pue"],
        )
        GpuPriceFactory(pricing_table=table, sku=sku, hourly_usd=prices["gpu"])
    return sku


def samples(n: int, start=START, seq: bool = True) -> list[dict]:
    """n samples one second apart, one GPU at 300 W (energy counter 300 J/s), 100 tokens a step."""
    rows = []
    for s in range(n):
        row = {
            "ts": (start + timedelta(seconds=s)).isoformat(),
            "step": s,
            "tokens": 100 * s,
            "power_w": 300.0,
            "energy_j": 300.0 * s,
            "util_pct": 100.0,
        }
        rows.append({"seq": s, **row} if seq else row)
    return rows


@pytest.fixture
def jsonl(tmp_path):
    def write(rows: list, name: str = "run.jsonl", raw: str | None = None) -> str:
        path = tmp_path / name
        path.write_text(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    return write


def upload(capsys, lab, path, *extra):
    return cli(capsys, "upload", path, "--experiment", str(lab["experiment"].pk), *extra)


def test_a_historical_run_is_priced_at_the_prices_of_its_own_time(lab, capsys, sku, jsonl):
    path = jsonl(samples(100, seq=False))  # seq given by line order
    code, out, err = upload(capsys, lab, path, "--arm", "control", "--gpu-sku", sku.name)
    assert code == 0, err
    run = Run.objects.get()
    assert out.splitlines()[0] == (
        f"run {run.pk} on arm 'control' (named) of experiment {lab['experiment'].pk}"
    )
    assert out.splitlines()[-1].startswith(f"run {run.pk}: succeeded · 100 samples (100 sent now")
    assert (run.kind, run.status, run.arm, run.gpu_count) == (
        "external",
        "succeeded",
        lab["control"],
        1,
    )
    assert run.run_key == "upload-" + hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert (run.started_at, run.finished_at) == (START, START + timedelta(seconds=99))
    assert sorted(TelemetrySample.objects.filter(run=run).values_list("seq", flat=True)) == list(
        range(100)
    )

    # Worked by hand: 99 s of GPU time (first to last sample) and 99 x 300 J at the old version.
    def bill(p):
        gpu = Decimal(99) / 3600 * p["gpu"]
        energy = Decimal(99 * 300) / Decimal(3_600_000) * p["pue"] * p["kwh"]
        return (gpu + energy).quantize(Decimal("0.000001"))

    assert run.cost_usd == bill(OLD) != bill(NEW)
    assert f"{bill(OLD):.6f} USD" in out


def test_bad_lines_are_refused_before_anything_is_sent(lab, capsys, sku, jsonl):
    good = [json.dumps(r) for r in samples(5)]
    cases = {
        "unknown": (good[:2] + ['{"seq": 2, "ts": 1.0, "power": 3}'], ":3: power: not a telemetry"),
        "type": (good[:3] + ['{"seq": 3, "ts": 1.0, "tokens": "7"}'], ":4: tokens: expected a"),
        "json": (good[:1] + ["{not json"], ":2: not a JSON object"),
        "no ts": (good[:1] + ['{"seq": 1}'], ":2: ts: required"),
        "naive ts": (good[:1] + ['{"seq": 1, "ts": "2026-01-01T00:00:00"}'], ":2: ts: "),
        "twice": (good[:2] + [good[1]], ":3: seq: 1 is on line 2 too"),
        "mixed": (good[:2] + ['{"ts": 5.0}'], ":3: seq: missing"),
        "counter": (
            good[:4] + [json.dumps({**samples(5)[4], "tokens": 1})],
            ":5: tokens: 1 is below 300 on line 4",
        ),
    }
    for name, (lines, said) in cases.items():
        path = jsonl([], name=f"{name.replace(' ', '-')}.jsonl", raw="\n".join(lines) + "\n")
        code, _out, err = upload(capsys, lab, path, "--arm", "control")
        assert code == 2 and f"{path}{said}" in err, (name, err)
    assert not Run.objects.exists() and not TelemetrySample.objects.exists()


def test_the_window_is_checked_here_and_by_the_server(lab, capsys, sku, jsonl):
    path = jsonl(samples(10))
    late = (START + timedelta(seconds=5)).isoformat()
    code, _, err = upload(capsys, lab, path, "--arm", "control", "--started-at", late)
    assert code == 2 and f"{path}:1: ts: {START.isoformat()} is outside the run's window" in err
    code, _, err = upload(capsys, lab, path, "--arm", "control", "--ended-at", late)
    assert code == 2 and f"{path}:7: ts: " in err and "outside the run's window" in err
    # The server's bounds: not in the future, not before the tenant's oldest price version.
    future = jsonl(samples(10, start=NOW + timedelta(hours=2)), name="future.jsonl")
    code, _, err = upload(capsys, lab, future, "--arm", "control")
    assert code == 2 and "HTTP 400: started_at: " in err and "is in the future" in err, err
    ancient = jsonl(samples(10, start=NOW - timedelta(days=400)), name="ancient.jsonl")
    code, _, err = upload(capsys, lab, ancient, "--arm", "control")
    assert code == 2 and "started_at: " in err and "before any price" in err, err
    assert "the oldest pricing table starts" in err
    assert not Run.objects.exists()


def test_an_interrupted_upload_resumes_and_sends_only_the_rest(
    lab, capsys, sku, jsonl, monkeypatch
):
    """The first half went in before the upload died (posted here with the API); a re-run finds
    the run by the file's key, sends the rest, and every seq is stored once."""
    import httpx

    rows = samples(100)
    path = jsonl(rows)
    key = "upload-" + hashlib.sha256(open(path, "rb").read()).hexdigest()
    with httpx.Client(
        base_url=lab["url"] + "/api/v1/", headers={"Authorization": f"Bearer {lab['token']}"}
    ) as http:
        run = http.post(
            "runs/",
            json={
                "experiment": lab["experiment"].pk,
                "arm": lab["candidate"].pk,
                "run_key": key,
                "kind": "external",
                "gpu_sku": sku.name,
                "started_at": rows[0]["ts"],
                "ended_at": rows[-1]["ts"],
            },
        ).json()
        half = http.post(f"runs/{run['id']}/telemetry/", json={"samples": rows[:50]})
        assert half.status_code == 200 and half.json()["inserted"] == 50

    from costlab_cli.client import Api

    sent = []
    real_post = Api.post

    def post(self, path, body, **kwargs):
        if path.endswith("/telemetry/"):
            sent.extend(s["seq"] for s in body["samples"])
        return real_post(self, path, body, **kwargs)

    monkeypatch.setattr(Api, "post", post)
    code, out, err = upload(capsys, lab, path, "--arm", "candidate", "--batch", "20")
    assert code == 0, err
    assert f"run {run['id']} on arm 'candidate'" in out and "resuming after seq 49" in out
    assert sent == list(range(50, 100))  # only what was missing, in 3 batches of at most 20
    assert "50 sent now, 50 of them new; 50 already stored" in out
    stored = list(TelemetrySample.objects.filter(run_id=run["id"]).values_list("seq", flat=True))
    assert sorted(stored) == list(range(100))
    assert Run.objects.get(pk=run["id"]).status == "succeeded" and Run.objects.count() == 1

    # Once more: the same run, already uploaded; nothing sent, nothing changed.
    sent.clear()
    code, out, err = upload(capsys, lab, path, "--arm", "candidate")
    assert code == 0 and "already uploaded and succeeded; nothing sent" in out, err
    assert sent == [] and Run.objects.count() == 1


def test_upload_can_ask_the_experiment_for_the_arm(lab, capsys, sku, jsonl):
    path = jsonl(samples(20))
    code, out, err = upload(capsys, lab, path, "--assign", "--status", "failed")
    assert code == 0, err
    run = Run.objects.get()
    assignment = ArmAssignment.objects.get()
    assert (assignment.run_key, assignment.arm_id) == (run.run_key, run.arm_id)
    assert "(assigned)" in out and run.status == "failed"
    code, out, err = upload(capsys, lab, path, "--assign")
    assert code == 0 and "(sticky)" in out and "already uploaded and failed" in out, err


def test_a_quota_refusal_is_reported_at_once_not_waited_out_as_an_outage(lab, capsys, sku, jsonl):
    """429 without Retry-After is a quota, not a throttle: retrying for --retry-for would only
    delay the same answer."""
    import time

    tenant = lab["experiment"].tenant
    tenant.max_concurrent_runs = 0
    tenant.save(update_fields=["max_concurrent_runs"])
    began = time.monotonic()
    code, _out, err = upload(capsys, lab, jsonl(samples(5)), "--assign", "--retry-for", "60")
    assert code != 0 and "max_concurrent_runs" in err
    assert time.monotonic() - began < 30  # --retry-for 60 would wait it out for a minute
    assert not Run.objects.exists()
