"""The data model's rules hold in the database itself, not only in Python."""

from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from apps.experiments.models import Arm
from apps.pricing.models import GpuPrice, PricingTable
from apps.telemetry.models import TelemetrySample
from tests.factories import (
    ArmFactory,
    ExperimentFactory,
    GpuPriceFactory,
    PricingTableFactory,
    RunFactory,
    TelemetrySampleFactory,
    TenantFactory,
)

pytestmark = pytest.mark.django_db


def refused(fn):
    with pytest.raises(IntegrityError), transaction.atomic():
        fn()


def test_duplicate_seq_for_a_run_is_refused():
    """The database refuses the same sample twice. On Postgres its unique index is (run, seq, ts),
    since a partitioned table's must hold the partition key; that a seq is stored once under any
    ts is ingest's to keep (tests/apps/telemetry/test_partitions.py)."""
    run = RunFactory()
    first = TelemetrySampleFactory(run=run, seq=7)
    refused(lambda: TelemetrySample.objects.create(run=run, seq=7, ts=first.ts))
    # Another run may use the same seq.
    TelemetrySampleFactory(run=RunFactory(arm=run.arm), seq=7)
    assert TelemetrySample.objects.filter(seq=7).count() == 2


def test_negative_prices_are_refused():
    price = GpuPriceFactory()
    refused(lambda: GpuPrice.objects.filter(pk=price.pk).update(hourly_usd=Decimal("-0.01")))
    table = price.pricing_table
    for field in ("electricity_usd_per_kwh", "vcpu_hour_usd", "memory_gb_hour_usd"):
        refused(
            lambda f=field: PricingTable.objects.filter(pk=table.pk).update(**{f: Decimal("-1")})
        )
    refused(lambda: PricingTable.objects.filter(pk=table.pk).update(pue=Decimal("0.9")))


def test_one_pricing_table_per_tenant_and_valid_from():
    table = PricingTableFactory()
    refused(lambda: PricingTableFactory(tenant=table.tenant, valid_from=table.valid_from))
    PricingTableFactory(tenant=TenantFactory(), valid_from=table.valid_from)  # other tenant: fine


def test_second_control_arm_is_refused():
    experiment = ExperimentFactory()
    ArmFactory(experiment=experiment, is_control=True)
    ArmFactory(experiment=experiment, is_control=False)
    refused(lambda: ArmFactory(experiment=experiment, is_control=True))
    ArmFactory(experiment=ExperimentFactory(), is_control=True)  # another experiment: fine


def test_negative_weight_and_frozen_arm_with_traffic_are_refused():
    arm = ArmFactory()
    refused(lambda: Arm.objects.filter(pk=arm.pk).update(weight=Decimal("-0.5")))
    refused(lambda: Arm.objects.filter(pk=arm.pk).update(state="frozen"))
    Arm.objects.filter(pk=arm.pk).update(state="frozen", weight=0)
    assert Arm.objects.get(pk=arm.pk).state == "frozen"


def test_run_key_is_unique_per_experiment():
    run = RunFactory(run_key="ci-1234")
    refused(lambda: RunFactory(arm=run.arm, run_key="ci-1234"))
    RunFactory(arm=run.arm, run_key="")
    RunFactory(arm=run.arm, run_key="")  # empty keys never collide


def test_arm_hash_follows_its_strategy_text():
    arm = ArmFactory(strategy_yaml="model: {preset: tiny}\n")
    first = arm.strategy_sha256
    arm.strategy_yaml = "model: {preset: small}\n"
    arm.save()
    assert len(first) == 64 and arm.strategy_sha256 != first
