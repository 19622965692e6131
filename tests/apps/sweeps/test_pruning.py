"""A sweep leaves out the points the queue's device profiles show dominated, and says why."""

from __future__ import annotations

import pytest

from apps.devices.services import device_profile_record
from apps.sweeps.pruning import dominated_values, space_pruned
from tests.factories import XEON_AMX, device_profile

pytestmark = pytest.mark.django_db

SPACE = {"train.global_batch": [1, 2], "precision.compute_dtype": ["fp32", "bf16", "auto"]}


def _record(cpu=None, host="w1"):
    device_profile_record(
        host=host,
        label="cpu",
        queues=["cpu"],
        profile=device_profile(host=host) if cpu is None else device_profile(cpu, host=host),
    )


def test_on_a_cpu_that_emulates_bf16_bf16_and_the_auto_twin_of_fp32_are_left_out():
    _record()
    pruned = dominated_values(expanded=SPACE, queue="cpu")
    assert [(p["key"], p["value"]) for p in pruned] == [
        ("precision.compute_dtype", "bf16"),
        ("precision.compute_dtype", "auto"),
    ]
    assert "0.02x fp32" in pruned[0]["reason"] and "resolves to fp32" in pruned[1]["reason"]
    assert space_pruned(SPACE, pruned)["precision.compute_dtype"] == ["fp32"]


def test_on_an_amx_cpu_bf16_stays_and_auto_is_its_twin():
    _record(XEON_AMX)
    pruned = dominated_values(expanded=SPACE, queue="cpu")
    assert [p["value"] for p in pruned] == ["auto"]
    assert space_pruned(SPACE, pruned)["precision.compute_dtype"] == ["fp32", "bf16"]


def test_devices_that_disagree_or_none_prune_nothing():
    assert dominated_values(expanded=SPACE, queue="cpu") == []  # no device seen yet
    _record()
    _record(XEON_AMX, host="w2")
    assert dominated_values(expanded=SPACE, queue="cpu") == []


def test_a_sweep_records_what_it_left_out_and_never_probes_it(django_capture_on_commit_callbacks):
    from apps.sweeps import services
    from tests.factories import TenantFactory

    _record()
    with django_capture_on_commit_callbacks(execute=False):
        sweep = services.sweep_create(
            tenant=TenantFactory(max_concurrent_runs=10),
            name="dtypes",
            base_strategy_yaml="model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n",
            space=SPACE,
            probe_count=6,
            probe_steps=3,
            parallelism=2,
        )
    assert [p["value"] for p in sweep.pruned] == ["bf16", "auto"]
    assert sweep.probe_count == 2 and sweep.sampler == "grid"  # 2 points left: a grid of them
    probed = {p.params["precision.compute_dtype"] for p in sweep.probes.all()}
    assert probed == {"fp32"}
