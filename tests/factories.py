"""Model factories shared by the suite."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.attribution.say.report import ArmReport
from apps.experiments.models import Arm, Experiment, Run
from apps.pricing.models import CostModel, GpuPrice, GpuSku, PricingTable
from apps.telemetry.models import TelemetrySample
from apps.tenants.models import Membership, Tenant

STRATEGY = "model: {family: llama, preset: tiny, seq_len: 64}\ndata: {source: synthetic}\n"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("pw-for-tests-only")


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)


class GpuSkuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuSku

    name = factory.Sequence(lambda n: f"Test GPU {n}")
    memory_gb = 80
    tdp_w = 700
    peak_bf16_tflops = Decimal("989.0")


class PricingTableFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PricingTable
        skip_postgeneration_save = True

    tenant = factory.SubFactory(TenantFactory)
    name = "Test prices"
    # One minute apart from 2025 on: never a tenant's explicit 2026-01-01 (the cycle of 28 days
    # this replaced collided with it, depending on test order: a flake under xdist's worksteal).
    valid_from = factory.Sequence(lambda n: datetime(2025, 1, 1, tzinfo=UTC) + timedelta(minutes=n))
    electricity_usd_per_kwh = Decimal("0.15")
    pue = Decimal("1.20")
    vcpu_hour_usd = Decimal("0.04")
    memory_gb_hour_usd = Decimal("0.005")

    @factory.post_generation
    def created(obj, create, extracted, **kwargs):
        """A table posted when it started (its created_at at its valid_from, never later than
        now): what prices a run from its valid_from. created=<datetime>: posted then (a
        retroactive table when that is after its valid_from)."""
        if not create:
            return
        at = extracted if extracted is not None else min(obj.valid_from, timezone.now())
        PricingTable.objects.filter(pk=obj.pk).update(created_at=at)
        obj.created_at = at


class GpuPriceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuPrice

    pricing_table = factory.SubFactory(PricingTableFactory)
    sku = factory.SubFactory(GpuSkuFactory)
    hourly_usd = Decimal("3.00")


class CostModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CostModel

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"cost model {n}")


class ExperimentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Experiment

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"experiment {n}")
    cost_model = factory.SubFactory(CostModelFactory, tenant=factory.SelfAttribute("..tenant"))


class ArmFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Arm

    experiment = factory.SubFactory(ExperimentFactory)
    name = factory.Sequence(lambda n: f"arm-{n}")
    strategy_yaml = STRATEGY


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run
        skip_postgeneration_save = True

    arm = factory.SubFactory(ArmFactory)
    experiment = factory.SelfAttribute("arm.experiment")
    tenant = factory.SelfAttribute("arm.experiment.tenant")
    config_yaml = factory.SelfAttribute("arm.strategy_yaml")
    config_sha256 = factory.SelfAttribute("arm.strategy_sha256")

    @factory.post_generation
    def created(obj, create, extracted, **kwargs):
        """created=<datetime>: a run made back then
        (telemetry is only taken after a run's creation)."""
        if extracted is not None:
            Run.objects.filter(pk=obj.pk).update(created_at=extracted)
            obj.created_at = extracted


class TelemetrySampleFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TelemetrySample

    run = factory.SubFactory(RunFactory)
    seq = factory.Sequence(int)
    ts = factory.LazyFunction(lambda: datetime.now(UTC))

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        """Written around ingest, so the run's stored span is widened here as ingest would."""
        from apps.telemetry.ingest import run_spans_refresh

        sample = super()._create(model_class, *args, **kwargs)
        run_spans_refresh([sample.run_id])
        sample.run.refresh_from_db(fields=["samples_from", "samples_to"])
        return sample


_ARM_REPORT = ArmReport(
    arm_id=1,
    name="b",
    is_control=False,
    state="active",
    weight=Decimal(1),
    runs=5,
    runs_succeeded=5,
    tokens=1,
    steps=1,
    gpu_hours=0,
    energy_kwh=0,
    energy_estimated=False,
    electricity_usd=0,
    total_usd=0,
    compared_usd=0,
    usd_per_mtok=1,
    metric="usd_per_mtok",
    metric_value=1,
    throughput_tok_s=None,
    completion_s=None,
    deviation=0.0,
    deviation_low=None,
    deviation_high=None,
    projected=None,
)


def arm_report(**changes) -> ArmReport:
    """An arm's report row (apps.attribution.say.report) with these fields changed: no database."""
    return replace(_ARM_REPORT, **changes)


# Device profiles (gpu_runtime.profile) of two CPUs the project has met: one that emulates bf16
# (AVX2 and FMA only) and one with AMX.
EPYC_AVX2 = ("AMD EPYC 7B13", ("avx2", "fma"), {"fp32": 60.0, "bf16": 1.2, "fp16": 1.0})
XEON_AMX = (
    "Intel(R) Xeon(R) Platinum 8481C",
    ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8"),
    {"fp32": 55.0, "bf16": 230.0, "fp16": 60.0},
)


def device_profile(cpu=EPYC_AVX2, *, host: str = "worker-1") -> dict:
    """A CPU's profile as a worker records it (DeviceProfile.as_dict()), from its model, flags and
    GFLOP/s per dtype, without timing anything."""
    import torch

    from gpu_runtime.profile import DeviceProfile, classify_cpu, cpu_device_class

    model, flags, gflops = cpu
    dtypes, notes = classify_cpu(model, flags, gflops)
    return DeviceProfile(
        host=host,
        device="cpu",
        device_label="cpu",
        device_class=cpu_device_class(model, flags),
        cpu_model=model,
        cpu_flags=tuple(flags),
        torch_version=torch.__version__,
        threads=2,
        dtypes=dtypes,
        notes=tuple(notes),
        measured_at="2026-12-01T00:00:00+00:00",
    ).as_dict()


def final_evaluation(run, value: float, *, at, metric: str = "eval_loss"):
    """The run's held-out evaluation at its last sample (what a finished run's quality is)."""
    from apps.telemetry.models import RunEvaluation

    return RunEvaluation.objects.create(
        run=run,
        seq=run.last_seq,
        ts=at,
        step=run.steps,
        tokens=run.tokens,
        metric=metric,
        value=value,
    )
