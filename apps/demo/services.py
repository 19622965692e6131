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

from apps.experiments.models import Arm, Experiment
from apps.experiments.services import run_submit
from apps.experiments.strategies import strategy_sha256
from apps.pricing.models import CostModel, GpuPrice, GpuSku, PricingTable
from apps.tenants.models import Membership, Tenant

EXAMPLE_VALID_FROM = datetime(2026, 1, 1, tzinfo=UTC)
DEMO_MAX_CONCURRENT_RUNS = 16

# (name, memory GB, board power W, dense BF16 TFLOPS, EXAMPLE price USD per GPU-hour)
EXAMPLE_SKUS = [
    ("NVIDIA H200 SXM 141GB", 141, 700, "989.0", "3.80"),
    ("NVIDIA H100 SXM 80GB", 80, 700, "989.0", "3.00"),
    ("NVIDIA A100 SXM 80GB", 80, 400, "312.0", "1.80"),
    ("NVIDIA L4 24GB", 24, 72, "121.0", "0.70"),
]

# Both arms train the tiny preset on CPU in about a minute, so `make run` shows training,
# telemetry and cost right away. The optimized arm switches on what the runtime supports.
CONTROL_STRATEGY = """\
model:     {family: llama, preset: tiny, seq_len: 64}
data:      {source: synthetic, prefetch: 0}
train:     {steps: 150, global_batch: 4, lr: 3.0e-4, seed: 0}
precision: {compute_dtype: fp32}
telemetry: {interval_s: 1.0}
"""

OPTIMIZED_STRATEGY = """\
model:     {family: llama, preset: tiny, seq_len: 64}
data:      {source: synthetic, pin_memory: true, prefetch: 2}
train:     {steps: 150, global_batch: 4, lr: 3.0e-4, seed: 0}
precision: {compute_dtype: bf16}
kernels:   {fused_optimizer: true}
telemetry: {interval_s: 1.0}
"""


@dataclass(frozen=True)
class DemoSeedResult:
    tenant: Tenant
    pricing_table: PricingTable
    experiment: Experiment
    runs_submitted: int
    admin_username: str
    admin_password: str | None  # None when the user already existed (password untouched)


@transaction.atomic
def demo_seed(*, admin_username: str = "admin", admin_email: str = "admin@example.com",
              submit_runs_per_arm: int = 0) -> DemoSeedResult:
    """Seed the demo; with submit_runs_per_arm, also queue runs when the demo experiment has none."""
    # Room beyond the demo's own queued runs (make run queues 2 per arm), so a new user's first
    # submissions are not refused by the quota.
    tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo team",
                                                                    "max_concurrent_runs": DEMO_MAX_CONCURRENT_RUNS})

    table, _ = PricingTable.objects.get_or_create(
        tenant=tenant,
        valid_from=EXAMPLE_VALID_FROM,
        defaults={
            "name": "Example prices",
            "electricity_usd_per_kwh": Decimal("0.15"),
            "pue": Decimal("1.20"),
            "vcpu_hour_usd": Decimal("0.04"),
            "memory_gb_hour_usd": Decimal("0.005"),
            "is_example": True,
            "notes": "EXAMPLE PRICES for the demo only. Not a quote from any provider; replace them.",
        },
    )
    for name, memory_gb, tdp_w, peak, price in EXAMPLE_SKUS:
        sku, _ = GpuSku.objects.get_or_create(
            name=name, defaults={"memory_gb": memory_gb, "tdp_w": tdp_w, "peak_bf16_tflops": Decimal(peak)}
        )
        GpuPrice.objects.get_or_create(pricing_table=table, sku=sku, defaults={"hourly_usd": Decimal(price)})

    cost_model, _ = CostModel.objects.get_or_create(
        tenant=tenant, name="Resource weighted (default)", defaults={"kind": CostModel.Kind.RESOURCE_WEIGHTED}
    )
    experiment, _ = Experiment.objects.get_or_create(
        tenant=tenant,
        name="Demo: baseline vs optimized",
        defaults={
            "description": "Plain PyTorch training against dynamic batching + bf16 + checkpointing.",
            "cost_model": cost_model,
            "status": Experiment.Status.ACTIVE,
            "min_runs_per_arm": 2,
            "target_steps": 100_000,
        },
    )
    for name, yaml_text, is_control in (
        ("pytorch-baseline", CONTROL_STRATEGY, True),
        ("costlab-optimized", OPTIMIZED_STRATEGY, False),
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
        user = User.objects.create_superuser(username=admin_username, email=admin_email, password=password)
    Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": Membership.Role.ADMIN})
    submitted = 0
    # Only into an empty demo: every `make run` seeds, and finished demo runs must not multiply.
    if submit_runs_per_arm and not experiment.runs.exists():
        for arm in experiment.arms.order_by("pk"):
            for _ in range(submit_runs_per_arm):
                run_submit(experiment=experiment, arm=arm)
                submitted += 1
    return DemoSeedResult(tenant=tenant, pricing_table=table, experiment=experiment, runs_submitted=submitted,
                          admin_username=admin_username, admin_password=password)
