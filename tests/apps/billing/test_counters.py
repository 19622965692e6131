"""Cumulative counters: a dip is refused in every batch, the first included, and a declared reset
counts from 0 with the reset sample's own counts kept (the audit's cases, issue 45)."""

import pytest

from apps.billing.services import telemetry_ingest
from apps.telemetry.models import TelemetrySample
from tests.apps.billing.test_ingest import gpu_run, samples  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("field", ["energy_j", "tokens"])
def test_a_dip_inside_the_first_batch_is_refused_alone_and_not_billed(gpu_run, field):  # noqa: F811
    batch = samples(20)
    batch[7][field] = 0  # a dip, no reset declared
    result = telemetry_ingest(run_id=gpu_run.pk, samples=batch)
    assert [r["field"] for r in result.refused] == [f"samples[7].{field}"]
    assert result.inserted == 19
    gpu_run.refresh_from_db()
    # billed as if the dip had never been sent: energy 300 J/s x 19 s, tokens 1000 x 19
    assert gpu_run.energy_j == pytest.approx(300.0 * 19) and gpu_run.tokens == 19_000


def test_a_declared_counter_reset_counts_from_zero_with_its_own_counts(gpu_run):  # noqa: F811
    batch = samples(10)  # energy 0 .. 2700 J, tokens 0 .. 9000
    after = samples(5, start=10)
    for k, s in enumerate(after):  # the sender restarted its counters at seq 10
        s["energy_j"], s["tokens"] = 500.0 + 300.0 * k, 400 + 1000 * k
    after[0]["counter_reset"] = True
    telemetry_ingest(run_id=gpu_run.pk, samples=batch)
    result = telemetry_ingest(run_id=gpu_run.pk, samples=after)
    assert result.refused == [] and TelemetrySample.objects.filter(run=gpu_run).count() == 15
    gpu_run.refresh_from_db()
    assert gpu_run.energy_j == pytest.approx(2700 + 500 + 4 * 300)
    assert gpu_run.tokens == 9000 + 400 + 4 * 1000


def test_steps_after_a_counter_reset_are_summed(gpu_run):  # noqa: F811
    """The audit: 100 steps, a reset, 149 more read 149 (a maximum); the run made 249."""
    before = samples(101)  # steps 0 .. 100
    after = samples(150, start=101)
    for k, s in enumerate(after):
        s["step"], s["tokens"], s["energy_j"] = k, 1000 * k, 300.0 * k
    after[0]["counter_reset"] = True
    for batch in (before[:60], before[60:], after[:70], after[70:]):
        assert telemetry_ingest(run_id=gpu_run.pk, samples=batch).refused == []
    gpu_run.refresh_from_db()
    assert gpu_run.steps == 100 + 149
    telemetry_ingest(run_id=gpu_run.pk, samples=after[:70])  # a batch sent again moves nothing
    gpu_run.refresh_from_db()
    assert gpu_run.steps == 249


def test_a_cpu_run_with_neither_power_nor_energy_has_unmeasured_carbon():
    """Issue 45: 0 g labelled 'rapl ±10 %' for a run that measured nothing; now unmeasured."""
    from apps.billing.bill import carbon_shown

    shown = carbon_shown(
        breakdown={"carbon_g": 0.0}, gpu_count=0, energy_estimated=False, energy_j=0.0, wall_s=60
    )
    assert shown["g_co2e"] is None and shown["method"] == "unmeasured" and shown["unmeasured"]
    measured = carbon_shown(
        breakdown={"carbon_g": 2.0}, gpu_count=0, energy_estimated=False, energy_j=9e4, wall_s=60
    )
    assert (measured["g_co2e"], measured["method"]) == (2.0, "rapl")
