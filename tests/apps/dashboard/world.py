"""A small priced world for dashboard tests: a team, its prices, a member, an experiment whose
runs trained through the real ingest path (so totals and costs are the platform's own)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from apps.billing.services import telemetry_ingest
from apps.experiments.models import Arm, Experiment, Run
from tests.factories import (
    ArmFactory,
    ExperimentFactory,
    MembershipFactory,
    PricingTableFactory,
    RunFactory,
    UserFactory,
)

PASSWORD = "pw-for-tests-only"


def samples(
    *,
    start: datetime,
    first_seq: int,
    n: int,
    interval_s: float = 1.0,
    util: float = 80.0,
    power_w: float = 300.0,
    estimated: bool = False,
    micro_batch: int = 8,
    **overrides,
) -> list[dict]:
    """n consecutive samples of one run, cumulative counters continuing from first_seq."""
    out = []
    for i in range(n):
        seq = first_seq + i
        out.append(
            {
                "seq": seq,
                "ts": (start + timedelta(seconds=i * interval_s)).isoformat(),
                "step": seq + 1,
                "device": "cpu",
                "util_pct": util,
                "power_w": power_w,
                "energy_j": power_w * interval_s * (seq + 1),
                "step_time_s": 0.5,
                "tokens": 1024 * (seq + 1),
                "tokens_per_s": 2048.0,
                "micro_batch": micro_batch,
                "loss": 3.0 - seq * 0.001,
                "estimated": estimated,
                **overrides,
            }
        )
    return out


def train(run: Run, *, n: int, start: datetime | None = None, **kwargs) -> Run:
    """Ingest n more samples for a run (after its last seq), then return it refreshed.

    Telemetry is only taken while a run is running: a finished run is reopened for the
    ingest and given its final status back, as if the samples had come before it ended."""
    run.refresh_from_db()
    final_status = run.status
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    first = run.last_seq + 1
    start = start or timezone.now() - timedelta(seconds=n)
    for i in range(0, n, 5000):
        telemetry_ingest(
            run_id=run.pk,
            samples=samples(
                start=start + timedelta(seconds=i),
                first_seq=first + i,
                n=min(5000, n - i),
                **kwargs,
            ),
            attempt=run.attempts,
        )
    Run.objects.filter(pk=run.pk).update(status=final_status)
    run.refresh_from_db()
    return run


@dataclass
class World:
    user: object
    experiment: Experiment
    control: Arm
    candidate: Arm


def world(*, username: str | None = None, staff: bool = False, status: str = "active") -> World:
    """A member of a team with example prices and a two-arm experiment (no runs yet)."""
    table = PricingTableFactory(
        valid_from=datetime(2026, 1, 1, tzinfo=UTC),
        is_example=True,
        vcpu_hour_usd=Decimal("0.04"),
        memory_gb_hour_usd=Decimal("0.005"),
        carbon_g_per_kwh=Decimal("400"),
    )
    user = UserFactory(**({"username": username} if username else {}), is_staff=staff)
    MembershipFactory(user=user, tenant=table.tenant)
    experiment = ExperimentFactory(tenant=table.tenant, status=status, target_steps=1000)
    control = ArmFactory(experiment=experiment, name="baseline", is_control=True)
    candidate = ArmFactory(experiment=experiment, name="optimized")
    return World(user=user, experiment=experiment, control=control, candidate=candidate)


def run_of(arm: Arm, *, status: str = Run.Status.SUCCEEDED, **fields) -> Run:
    now = timezone.now()
    defaults = {
        "vcpus": 2,
        "memory_gb": 4.0,
        "attempts": 1,
        "started_at": now - timedelta(minutes=10),
    }
    if status in (Run.Status.SUCCEEDED, Run.Status.FAILED):
        defaults["finished_at"] = now - timedelta(minutes=1)
    if status == Run.Status.RUNNING:
        defaults["heartbeat_at"] = now
    run = RunFactory(arm=arm, status=status, **{**defaults, **fields})
    # Created before its telemetry, as a real run is (ingest refuses samples older than the run);
    # priced by the tables there are now from their valid_from (a table posted after a run opened
    # would otherwise price it only from its posting: apps.pricing.selectors.effective_starts).
    Run.objects.filter(pk=run.pk).update(created_at=now - timedelta(minutes=15), prices_as_of=now)
    run.refresh_from_db()
    return run
