"""End to end with a real Celery worker process: a team's own (tiny, locally built) Hugging Face
checkpoint, fine-tuned with LoRA on the shipped instruction data, trains, streams telemetry,
gets a cost, records its trainable / total parameters and saves its adapter as an artifact."""

from pathlib import Path

import pytest

from apps.experiments.models import Run
from apps.experiments.services import run_submit
from apps.telemetry.models import TelemetrySample
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from tests.helpers import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]

DATASET = Path(__file__).resolve().parents[2] / "gpu_runtime" / "datasets" / "instructions.jsonl"


def test_a_worker_fine_tunes_a_local_hf_checkpoint_with_lora(celery_worker_process, tmp_path):
    from gpu_runtime.tinyhf import build_checkpoint

    checkpoint = build_checkpoint(tmp_path / "tiny-llama", "llama", layers=2, hidden=64)
    strategy = f"""\
model: {{family: hf, path: "{checkpoint}", seq_len: 64}}
data: {{source: jsonl, path: "{DATASET}", loss_on: response}}
train: {{steps: 24, global_batch: 4, seed: 1, lr: 1.0e-3}}
finetune: {{method: lora, r: 4, save: true}}
telemetry: {{interval_s: 0.05}}
"""
    price = GpuPriceFactory()
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=strategy)
    run = run_submit(experiment=exp)
    run = wait_for(
        lambda: Run.objects.filter(pk=run.pk, status__in=["succeeded", "failed"]).first(),
        180,
        "the run to end",
    )
    assert run.status == "succeeded", run.error
    assert TelemetrySample.objects.filter(run=run).exists()
    # Billed from its samples' intervals: on a quiet machine 8 steps took 0.2 s, one sample, and
    # $0.000000; 24 steps sampled every 0.05 s are priced in every run.
    assert run.steps == 24 and run.cost_usd > 0
    # the prompts are read but not trained on: fewer trained tokens than the rows hold
    assert 0 < run.tokens < 24 * 4 * 64
    assert 0 < run.params_trainable < run.params_total / 10
    [adapter] = run.artifacts
    assert adapter["kind"] == "lora_adapter" and adapter["bytes"] > 0
    assert adapter["dataset_sha256"] == run.dataset_sha256
