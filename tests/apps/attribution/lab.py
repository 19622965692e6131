"""A simulated experiment for attribution tests: runs whose priced totals move as ingest would move
them.

The tick reads run totals, never samples, so moving the totals directly (one bulk UPDATE per
step) tests it on exactly its input, and fast enough for hundreds of ticks. Seeded.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.db import connection

from apps.attribution.services import attribution_tick
from apps.experiments.models import Arm, Run
from tests.factories import (
    ArmFactory,
    ExperimentFactory,
    GpuPriceFactory,
    PricingTableFactory,
    RunFactory,
)

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
MICRO = Decimal("0.000001")
# A GPU at 3 USD/h pushing 10k tokens/s: 0.0833 USD per 1M tokens.
USD_PER_TOKEN = 3.0 / 3600 / 10_000


def priced_tenant():
    """A tenant with a pricing table in force and a GPU SKU priced in it; returns the GpuPrice."""
    return GpuPriceFactory(
        pricing_table=PricingTableFactory(valid_from=datetime(2026, 1, 1, tzinfo=UTC))
    )


class Lab:
    """One experiment; arms given as name -> true cost factor (the first is the control)."""

    def __init__(
        self,
        arms: dict[str, float],
        *,
        runs_per_arm: int = 10,
        noise: float = 0.02,
        seed: int = 0,
        price=None,
        interval_s: int = 30,
        **experiment,
    ):
        self.price = price or priced_tenant()
        self.rng = random.Random(seed)
        self.noise = noise
        experiment.setdefault("status", "active")
        self.experiment = ExperimentFactory(
            tenant=self.price.pricing_table.tenant, attribution_interval_s=interval_s, **experiment
        )
        self.arms: dict[str, Arm] = {}
        self.factor: dict[int, float] = {}
        self.run_factor: dict[int, float] = {}  # run id -> its own cost factor (its hardware's)
        self.runs: list[Run] = []
        for i, (name, factor) in enumerate(arms.items()):
            arm = ArmFactory(experiment=self.experiment, name=name, is_control=i == 0)
            self.arms[name] = arm
            self.factor[arm.pk] = factor
            for _ in range(runs_per_arm):
                self.add_run(arm)
        self.now = T0
        self.interval = timedelta(seconds=interval_s)

    def add_run(self, arm: Arm, *, device_class: str = "", factor: float = 1.0) -> Run:
        run = RunFactory(
            device_class=device_class,
            arm=arm,
            status=Run.Status.RUNNING,
            gpu_sku=self.price.sku,
            gpu_count=1,
            attempts=1,
            started_at=T0 - timedelta(minutes=5),
        )
        self.runs.append(run)
        self.run_factor[run.pk] = factor
        return run

    def step(
        self, *, seconds: float = 30.0, samples: int = 30, runs: list[Run] | None = None
    ) -> None:
        """Every run (or the given ones) trains `seconds` more: tokens, cost, samples,
        energy move."""
        moved = []
        for run in runs if runs is not None else self.runs:
            if run.arm_id not in self.factor:
                continue
            tokens = max(1, int(10_000 * seconds * (1 + 0.05 * self.rng.gauss(0, 1))))
            cost = (
                tokens
                * USD_PER_TOKEN
                * self.factor[run.arm_id]
                * self.run_factor.get(run.pk, 1.0)
                * (1 + self.noise * self.rng.gauss(0, 1))
            )
            run.tokens += tokens
            run.steps += samples
            run.priced_seq += samples
            run.last_seq = run.priced_seq
            run.device_seconds += seconds
            run.energy_j += 600.0 * seconds
            run.cost_usd = (Decimal(run.cost_usd) + Decimal(repr(max(cost, 0.0)))).quantize(
                MICRO, rounding=ROUND_HALF_EVEN
            )
            moved.append(run)
        with connection.cursor() as cursor:  # what run_totals_advance writes, for many runs at once
            cursor.executemany(
                f"UPDATE {Run._meta.db_table} SET tokens = %s, steps = %s, "
                "priced_seq = %s, last_seq = %s, "
                "device_seconds = %s, energy_j = %s, cost_usd = %s WHERE id = %s",
                [
                    (
                        r.tokens,
                        r.steps,
                        r.priced_seq,
                        r.last_seq,
                        r.device_seconds,
                        r.energy_j,
                        r.cost_usd,
                        r.pk,
                    )
                    for r in moved
                ],
            )

    def tick(self, **kwargs):
        self.now += self.interval
        return attribution_tick(now=self.now, **kwargs)

    def run_ticks(self, n: int, **step):
        results = []
        for _ in range(n):
            self.step(**step)
            results.append(self.tick())
        return results

    def arm(self, name: str) -> Arm:
        arm = self.arms[name]
        arm.refresh_from_db()
        return arm
