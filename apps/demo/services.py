"""The demo data `make run` seeds: example prices, a demo tenant, an admin user.

Idempotent: every object is looked up by its natural key first, so seeding twice
changes nothing. The admin password is generated, printed once, never stored in code.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction

from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.services import run_submit
from apps.experiments.strategies import strategy_sha256
from apps.pricing.models import CostModel, GpuPrice, GpuSku, PricingTable
from apps.tenants.models import Membership, Tenant

EXAMPLE_VALID_FROM = datetime(2026, 1, 1, tzinfo=UTC)
DEMO_MAX_CONCURRENT_RUNS = 24

# (name, memory GB, board power W, dense BF16 TFLOPS, EXAMPLE price USD per GPU-hour)
EXAMPLE_SKUS = [
    ("NVIDIA H200 SXM 141GB", 141, 700, "989.0", "3.80"),
    ("NVIDIA H100 SXM 80GB", 80, 700, "989.0", "3.00"),
    ("NVIDIA A100 SXM 80GB", 80, 400, "312.0", "1.80"),
    ("NVIDIA L4 24GB", 24, 72, "121.0", "0.70"),
]

# Two arms that differ on the machine they run on, whatever it is: the control runs fp32 one
# sequence at a time; the optimized arm computes in `auto` precision (the fastest dtype this host's
# device runs natively, from the profile the worker measured at start: bf16 on a CPU with AMX or
# AVX512-BF16, fp32 where bf16 is emulated, 30-60x slower) and lets dynamic batching grow the
# micro-batch (the global batch of 8 stays fixed) while it fits and is faster, up to where the
# profile's GEMM throughput stops rising (max_micro_batch: auto; 1 where it is flat from one
# sequence of 256 rows on, and the micro-batch then stays 1: the run page says so). So the
# optimized arm is never a strategy the host's profile shows to be slower. seq_len 256 keeps a step
# matmul-bound. Each run is ~30 s of CPU time for the control: `make run` queues DEMO_RUNS_PER_ARM
# of each, interleaved, and the verdict card names the device class it compared on. The
# description below is checked against these two configs (tests/apps/core/test_demo_seed.py).
CONTROL_STRATEGY = """\
model:     {family: llama, preset: tiny, seq_len: 256}
data:      {source: synthetic, prefetch: 0}
train:     {steps: 30, global_batch: 8, micro_batch: 1, lr: 3.0e-4, seed: 0}
precision: {compute_dtype: fp32}
telemetry: {interval_s: 1.0}
eval:      {every_steps: 10, holdout: 0.1, max_tokens: 1024}
"""

OPTIMIZED_STRATEGY = """\
model:     {family: llama, preset: tiny, seq_len: 256}
data:      {source: synthetic, prefetch: 0}
train:     {steps: 30, global_batch: 8, micro_batch: 1, lr: 3.0e-4, seed: 0}
precision: {compute_dtype: auto}
kernels:   {compile: auto}
optimizer:
  dynamic_batching: {enabled: true, min_micro_batch: 1, max_micro_batch: auto, probe_steps: 1}
telemetry: {interval_s: 1.0}
eval:      {every_steps: 10, holdout: 0.1, max_tokens: 1024}
"""

# A third arm that is cheaper per token and trains a worse model, on any host: a global batch four
# times larger (micro-batches of 4, 8 steps: the tokens of the control's 30 steps of 8, 65,536
# against 61,440) at the same learning rate. A quarter of the optimizer updates leaves its held-out
# loss far behind (3.95 against 3.05 after the same tokens, Intel Xeon, 2 cores, AMX (bf16
# native), one thread): the card calls it cheaper_but_worse and the quality rule freezes it, while
# costlab-optimized (the same held-out loss, 3.0498) reads cheaper and non-inferior.
BIG_BATCH_STRATEGY = """\
model:     {family: llama, preset: tiny, seq_len: 256}
data:      {source: synthetic, prefetch: 0}
train:     {steps: 8, global_batch: 32, micro_batch: 4, lr: 3.0e-4, seed: 0}
precision: {compute_dtype: auto}
telemetry: {interval_s: 1.0}
eval:      {every_steps: 4, holdout: 0.1, max_tokens: 1024}
"""

DEMO_NAME = "Demo: fp32 vs auto precision + dynamic batching"
DEMO_DESCRIPTION = (
    "Control: fp32, micro-batch 1, global batch of 8. "
    "Optimized: auto precision (the fastest dtype the device runs natively, from its measured "
    "profile) and dynamic batching growing the micro-batch from 1 up to auto, where the device's "
    "GEMM throughput stops rising: 1 on a host where larger micro-batches buy nothing; and "
    "compile auto, which compiles only where the run is long enough to repay the compile (not "
    "these 30 steps, unless a cached graph makes it pay). "
    "Otherwise alike: tiny preset, seq_len 256, 30 steps, synthetic data. "
    "Big batch: auto precision, a global batch of 32 in micro-batches of 4 for 8 steps (about "
    "the same tokens): cheaper per token, but a quarter of the updates trains a worse model. "
    "Each run's page says what auto chose on its device."
)
DEMO_RUNS_PER_ARM = 6
# Evidence minimums sized to a demo: a verdict ("cheaper", or a freeze) after a few runs, not a few
# hundred.
DEMO_EXPERIMENT = {
    "min_runs_per_arm": 3,
    # The always-valid bound is asymptotic: 3 runs per arm is a demo's trade, said on its card.
    "min_cs_runs_per_arm": 3,
    "min_samples_per_arm": 20,
    "attribution_interval_s": 10,
    "freeze_threshold": Decimal("0.05"),
}


@dataclass(frozen=True)
class DemoSeedResult:
    tenant: Tenant
    pricing_table: PricingTable
    experiment: Experiment
    runs_submitted: int
    admin_username: str
    admin_password: str | None  # None when the user already existed (password untouched)


@transaction.atomic
def demo_seed(
    *,
    admin_username: str = "admin",
    admin_email: str = "admin@example.com",
    submit_runs_per_arm: int = 0,
) -> DemoSeedResult:
    """Seed the demo; with submit_runs_per_arm, also queue runs when the demo experiment has
    none."""
    # Room beyond the demo's own queued runs (make run queues 6 per arm), so a new user's first
    # submissions are not refused by the quota.
    tenant, _ = Tenant.objects.get_or_create(
        slug="demo", defaults={"name": "Demo team", "max_concurrent_runs": DEMO_MAX_CONCURRENT_RUNS}
    )

    table, _ = PricingTable.objects.get_or_create(
        tenant=tenant,
        valid_from=EXAMPLE_VALID_FROM,
        defaults={
            "name": "Example prices",
            "electricity_usd_per_kwh": Decimal("0.15"),
            "pue": Decimal("1.20"),
            "vcpu_hour_usd": Decimal("0.04"),
            "memory_gb_hour_usd": Decimal("0.005"),
            "carbon_g_per_kwh": Decimal("400"),  # an example grid intensity, like the prices
            "carbon_region": "example grid",
            "is_example": True,
            "notes": "EXAMPLE PRICES for the demo only. "
            "Not a quote from any provider; replace them. The grid intensity (400 gCO2e/kWh) "
            "is an example too.",
        },
    )
    for name, memory_gb, tdp_w, peak, price in EXAMPLE_SKUS:
        sku, _ = GpuSku.objects.get_or_create(
            name=name,
            defaults={"memory_gb": memory_gb, "tdp_w": tdp_w, "peak_bf16_tflops": Decimal(peak)},
        )
        GpuPrice.objects.get_or_create(
            pricing_table=table, sku=sku, defaults={"hourly_usd": Decimal(price)}
        )

    cost_model, _ = CostModel.objects.get_or_create(
        tenant=tenant,
        name="Resource weighted (default)",
        defaults={"kind": CostModel.Kind.RESOURCE_WEIGHTED},
    )
    experiment, _ = Experiment.objects.get_or_create(
        tenant=tenant,
        name=DEMO_NAME,
        defaults={
            "description": DEMO_DESCRIPTION,
            "cost_model": cost_model,
            "status": Experiment.Status.ACTIVE,
            "target_steps": 100_000,
            **DEMO_EXPERIMENT,
        },
    )
    for name, yaml_text, is_control in (
        ("pytorch-baseline", CONTROL_STRATEGY, True),
        ("costlab-optimized", OPTIMIZED_STRATEGY, False),
        ("big-batch", BIG_BATCH_STRATEGY, False),
    ):
        Arm.objects.get_or_create(
            experiment=experiment,
            name=name,
            defaults={
                "strategy_yaml": yaml_text,
                "strategy_sha256": strategy_sha256(yaml_text),
                "is_control": is_control,
            },
        )

    User = get_user_model()
    password = None
    user = User.objects.filter(username=admin_username).first()
    if user is None:
        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser(
            username=admin_username, email=admin_email, password=password
        )
    Membership.objects.get_or_create(
        user=user, tenant=tenant, defaults={"role": Membership.Role.ADMIN}
    )
    submitted = 0
    # Only into an empty demo: every `make run` seeds, and finished demo runs must not multiply.
    if submit_runs_per_arm and not experiment.runs.exists():
        arms = list(experiment.arms.order_by("pk"))
        queued = submit_runs_per_arm * len(arms)
        if (
            tenant.max_concurrent_runs < queued
        ):  # the demo's own tenant: its quota fits the demo's queue
            tenant.max_concurrent_runs = queued
            tenant.save(update_fields=["max_concurrent_runs"])
        for _ in range(
            submit_runs_per_arm
        ):  # interleaved: the machine's drift hits both arms alike
            for arm in arms:
                # Batch: a team's ci or normal run submitted meanwhile is taken first.
                run_submit(experiment=experiment, arm=arm, priority=Run.Priority.BATCH)
                submitted += 1
    return DemoSeedResult(
        tenant=tenant,
        pricing_table=table,
        experiment=experiment,
        runs_submitted=submitted,
        admin_username=admin_username,
        admin_password=password,
    )
