"""Telemetry over HTTP: an external run's batches (idempotent by seq), and downsampled reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from tests.apps.api.conftest import error
from tests.factories import RunFactory, TelemetrySampleFactory

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def batch(start: int, n: int) -> list[dict]:
    return [
        {
            "seq": s,
            "ts": (T0 + timedelta(seconds=s)).isoformat(),
            "step": s,
            "power_w": 100.0 + s,
            "energy_j": 100.0 * s,
            "tokens": 64 * s,
            "util_pct": 50.0,
        }
        for s in range(start, start + n)
    ]


@pytest.fixture
def external(experiment):
    return RunFactory(
        arm=experiment.arms.first(),
        kind="external",
        status="running",
        created=T0 - timedelta(minutes=1),
    )


def test_ingest_is_idempotent_by_seq_and_moves_the_totals(api, external):
    url = f"/api/v1/runs/{external.pk}/telemetry/"
    first = api.post(url, {"samples": batch(0, 10)}, format="json")
    assert first.status_code == 200 and first.json() == {
        "received": 10,
        "inserted": 10,
        "duplicates": 0,
        "refused": [],
    }
    retried = api.post(url, {"samples": batch(5, 10)}, format="json").json()
    assert retried == {"received": 10, "inserted": 5, "duplicates": 5, "refused": []}
    assert TelemetrySample.objects.filter(run=external).count() == 15
    external.refresh_from_db()
    assert external.last_seq == 14 and external.tokens > 0


def test_a_bad_sample_names_its_index_and_field_and_nothing_is_stored(api, external):
    samples = batch(0, 5)
    samples[3]["util_pct"] = 140
    response = api.post(
        f"/api/v1/runs/{external.pk}/telemetry/", {"samples": samples}, format="json"
    )
    assert response.status_code == 400
    assert error(response)["message"].startswith("samples[3].util_pct:")
    assert "samples[3].util_pct" in error(response)["fields"]
    shape = api.post(f"/api/v1/runs/{external.pk}/telemetry/", {"samples": [1, 2]}, format="json")
    assert shape.status_code == 400 and "samples" in error(shape)["fields"]
    assert not TelemetrySample.objects.exists()


def test_only_running_external_runs_take_telemetry(api, experiment, external):
    worker_run = RunFactory(arm=experiment.arms.first(), status="running")
    refused = api.post(
        f"/api/v1/runs/{worker_run.pk}/telemetry/", {"samples": batch(0, 1)}, format="json"
    )
    assert refused.status_code == 409 and error(refused)["code"] == "not_external"
    Run.objects.filter(pk=external.pk).update(status="succeeded")
    late = api.post(
        f"/api/v1/runs/{external.pk}/telemetry/", {"samples": batch(0, 1)}, format="json"
    )
    assert late.status_code == 409 and error(late)["code"] == "run_finished"
    assert not TelemetrySample.objects.exists()


def test_read_is_downsampled_to_the_budget_keeping_peaks(api, external):
    for s in range(1000):
        TelemetrySampleFactory(
            run=external,
            seq=s,
            ts=T0 + timedelta(seconds=s),
            power_w=300.0 if s == 777 else 100.0,
            util_pct=float(s % 100),
            estimated=s == 3,
        )
    body = api.get(
        f"/api/v1/runs/{external.pk}/telemetry/?fields=power_w,util_pct&budget=50"
    ).json()
    assert body["budget"] == 50 and body["samples"] == 1000 and body["estimated"] is True
    power = body["series"]["power_w"]
    assert power["unit"] == "W" and len(power["points"]) <= 50
    assert max(v for _, v in power["points"]) == 300.0  # the spike survives downsampling
    assert len(body["series"]["util_pct"]["points"]) <= 50


def test_read_budget_is_capped_and_fields_are_checked(api, external, settings):
    settings.COSTLAB_API_TELEMETRY_MAX_BUDGET = 10
    for s in range(40):
        TelemetrySampleFactory(run=external, seq=s, ts=T0 + timedelta(seconds=s), power_w=float(s))
    body = api.get(f"/api/v1/runs/{external.pk}/telemetry/?fields=power_w&budget=100000").json()
    assert body["budget"] == 10 and len(body["series"]["power_w"]["points"]) <= 10
    bad = api.get(f"/api/v1/runs/{external.pk}/telemetry/?fields=password")
    assert bad.status_code == 400 and "password" in error(bad)["message"]
    window = api.get(
        f"/api/v1/runs/{external.pk}/telemetry/",
        {"fields": "power_w", "since": (T0 + timedelta(seconds=30)).isoformat()},
    )
    assert [v for _, v in window.json()["series"]["power_w"]["points"]] == [
        float(s) for s in range(30, 40)
    ]


def ddp_external(experiment) -> Run:
    return RunFactory(
        arm=experiment.arms.first(),
        kind="external",
        status="running",
        created=T0 - timedelta(minutes=1),
        world_size=4,
        gpu_count=4,
    )


def test_an_appended_ddp_batch_reads_the_run_once_and_each_ranks_predecessor_in_one_query(
    api, experiment
):
    """The ingest hot path: the run is read once, locked, by the query that also checks its
    tenant; the pricing tables with the SKU's rate in one query; one transaction (no savepoint
    of a second atomic); and the ranks' predecessors in one query, whatever the world size."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run = ddp_external(experiment)
    url = f"/api/v1/runs/{run.pk}/telemetry/"

    def ranked(first: int, n: int) -> list[dict]:
        return ranked_samples(range(first, first + n), range(4))

    assert api.post(url, {"samples": ranked(0, 5)}, format="json").status_code == 200
    with CaptureQueriesContext(connection) as seen:
        second = api.post(url, {"samples": ranked(5, 5)}, format="json")
    assert second.status_code == 200 and second.json()["inserted"] == 20
    sqls = [q["sql"] for q in seen.captured_queries]
    run_reads = [s for s in sqls if s.startswith("SELECT") and 'FROM "experiments_run"' in s]
    assert len(run_reads) == 1, run_reads
    assert "FOR UPDATE" in run_reads[0] and '"experiments_run"."tenant_id" =' in run_reads[0]
    pricing = ('FROM "pricing_pricingtable"', 'FROM "pricing_gpuprice"')
    pricing_reads = [s for s in sqls if any(table in s for table in pricing)]
    assert len(pricing_reads) == 1, pricing_reads  # the tables, the SKU's rate a subquery
    # Inside the test's own transaction, the service's atomic and the insert's own are two
    # savepoints, set and released; a second atomic around the service would add a third.
    assert sum(s.startswith(("SAVEPOINT", "RELEASE SAVEPOINT")) for s in sqls) == 4, sqls
    sample_reads = [s for s in sqls if "telemetry_telemetrysample" in s and s.startswith("SELECT")]
    assert len(sample_reads) <= 2, sample_reads  # the predecessors, and the gap-free end
    assert not any("LATERAL" in s for s in sample_reads)  # found in the span's last minutes
    # ... and the bill is the one of the samples sent in one batch.
    alone = ddp_external(experiment)
    api.post(f"/api/v1/runs/{alone.pk}/telemetry/", {"samples": ranked(0, 10)}, format="json")
    run.refresh_from_db()
    alone.refresh_from_db()
    assert run.cost_usd == alone.cost_usd
    assert run.device_seconds == pytest.approx(alone.device_seconds) and run.device_seconds > 0
    assert run.energy_j == pytest.approx(alone.energy_j) and run.energy_j > 0


def test_an_appended_batch_compiles_no_sql_for_the_run_its_prices_or_its_totals(api, experiment):
    """The hot path's three ORM statements (the run's locked read, the pricing tables, the
    totals' UPDATE) are compiled once per process, not per batch: compiling the locked read cost
    more CPU than running it (apps.core.db.Compiled)."""
    from django.db.models.sql.compiler import SQLCompiler, SQLUpdateCompiler

    from apps.pricing.models import PricingTable

    run = ddp_external(experiment)
    url = f"/api/v1/runs/{run.pk}/telemetry/"
    first = api.post(url, {"samples": ranked_samples(range(0, 5), range(4))}, format="json")
    assert first.status_code == 200
    compiled = []
    originals = {cls: cls.as_sql for cls in (SQLCompiler, SQLUpdateCompiler)}

    def counting(original):
        def counted(self, *args, **kwargs):
            compiled.append(self.query.model)
            return original(self, *args, **kwargs)

        return counted

    for cls, original in originals.items():
        cls.as_sql = counting(original)
    try:
        second = api.post(url, {"samples": ranked_samples(range(5, 10), range(4))}, format="json")
    finally:
        for cls, original in originals.items():
            cls.as_sql = original
    assert second.status_code == 200 and second.json()["inserted"] == 20
    assert not [m for m in compiled if m in (Run, PricingTable)], compiled
    run.refresh_from_db()
    assert run.last_seq == 39 and run.device_seconds > 0


def test_telemetry_of_a_run_outside_the_tenant_or_a_bad_id_is_404(api, experiment):
    other = RunFactory(kind="external", status="running", created=T0 - timedelta(minutes=1))
    for pk in (other.pk, "nope", 10**9, 10**20, -1, "1e3", 0):
        response = api.post(
            f"/api/v1/runs/{pk}/telemetry/", {"samples": batch(0, 1)}, format="json"
        )
        assert response.status_code == 404, (pk, response.content)
        # A bad body for a run the tenant does not have: still 404 (nothing of it is said).
        bad = api.post(f"/api/v1/runs/{pk}/telemetry/", {"samples": "x"}, format="json")
        assert bad.status_code == 404, (pk, bad.content)
    assert not TelemetrySample.objects.exists()


def ranked_samples(ks, ranks) -> list[dict]:
    return [{**batch(k, 1)[0], "seq": 4 * k + rank, "rank": rank} for k in ks for rank in ranks]


def test_a_rank_silent_for_longer_than_the_tail_window_is_still_billed_from_its_own_last_row(
    api, experiment
):
    """Rank 3 falls silent for 400 s, beyond the window its predecessor is first looked for in:
    the lookup over the whole span finds it, and the bill is that of all samples in one batch."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.telemetry.rollup import TAIL_WINDOW

    assert TAIL_WINDOW.total_seconds() < 400
    run, whole = ddp_external(experiment), ddp_external(experiment)
    parts = [
        ranked_samples(range(5), range(4)),
        ranked_samples(range(5, 400), range(3)),
        ranked_samples(range(400, 405), range(4)),
    ]
    url = f"/api/v1/runs/{run.pk}/telemetry/"
    for part in parts[:2]:
        assert api.post(url, {"samples": part}, format="json").status_code == 200
    with CaptureQueriesContext(connection) as seen:
        assert api.post(url, {"samples": parts[2]}, format="json").status_code == 200
    assert any("LATERAL" in q["sql"] for q in seen.captured_queries)
    everything = sorted(parts[0] + parts[1] + parts[2], key=lambda s: s["seq"])
    api.post(f"/api/v1/runs/{whole.pk}/telemetry/", {"samples": everything}, format="json")
    run.refresh_from_db()
    whole.refresh_from_db()
    assert run.last_seq == whole.last_seq == 4 * 404 + 3
    assert run.device_seconds == pytest.approx(whole.device_seconds) and run.device_seconds > 0
    assert run.energy_j == pytest.approx(whole.energy_j) and run.cost_usd == whole.cost_usd


def test_rows_of_several_attempts_are_looked_up_over_the_whole_span(api, experiment):
    """The short read of the last minutes is exact only while the stored rows share an attempt:
    the run keeps which (Run.samples_attempt), and once a second one lands it reads the span."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run = ddp_external(experiment)
    url = f"/api/v1/runs/{run.pk}/telemetry/"

    def post(ks, attempt=None) -> list[str]:
        body = {"samples": ranked_samples(ks, range(4))}
        if attempt is not None:
            body["attempt"] = attempt
        with CaptureQueriesContext(connection) as seen:
            assert api.post(url, body, format="json").status_code == 200
        return [q["sql"] for q in seen.captured_queries]

    post(range(0, 5))
    run.refresh_from_db()
    assert run.samples_attempt == 1
    assert not any("LATERAL" in s for s in post(range(5, 10)))
    post(range(10, 15), attempt=2)
    run.refresh_from_db()
    assert run.samples_attempt == 0
    assert any("LATERAL" in s for s in post(range(15, 20), attempt=2))


def test_a_second_sampler_of_one_rank_is_refused_and_the_first_keeps_streaming(api, external):
    """Two samplers of one rank send the same seqs and the server keeps the first copy: the
    assignment flow's idle sampler once kept 15 of a run's 16 samples at step 0. The first
    stream of a rank holds it; another stream of that rank is refused whole, naming the fix."""
    url = f"/api/v1/runs/{external.pk}/telemetry/"
    first = [{**s, "stream": "a" * 32} for s in batch(0, 3)]
    assert api.post(url, {"samples": first}, format="json").json()["inserted"] == 3
    second = [{**s, "stream": "b" * 32} for s in batch(3, 2)]
    refused = api.post(url, {"samples": second}, format="json")
    assert refused.status_code == 409
    assert error(refused)["code"] == "second_sampler"
    assert "rank 0 is already streamed by another sampler" in error(refused)["message"]
    assert "CostlabCallback(run=run)" in error(refused)["message"]
    assert TelemetrySample.objects.filter(run=external).count() == 3
    # the first goes on (a resent spool carries its stream too); samples naming none are taken
    again = [{**s, "stream": "a" * 32} for s in batch(3, 2)]
    assert api.post(url, {"samples": again}, format="json").json()["inserted"] == 2
    assert api.post(url, {"samples": batch(5, 1)}, format="json").json()["inserted"] == 1
    assert Run.objects.get(pk=external.pk).streams == {"0": "a" * 32}
