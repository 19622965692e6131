"""Held-out evaluations ride on telemetry samples: stored once per (run, seq, metric), bad values
refused naming the field with nothing stored."""

import math

import pytest

from apps.billing.services import telemetry_ingest
from apps.core.exceptions import ApplicationError
from apps.telemetry.models import RunEvaluation, TelemetrySample
from tests.apps.billing.test_ingest import gpu_run, samples  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def with_evals(batch, **by_seq):
    for s in batch:
        s.update(by_seq.get(f"s{s['seq']}", {}))
    return batch


def test_an_evaluation_is_stored_once_with_its_step_and_tokens(gpu_run):  # noqa: F811
    batch = with_evals(
        samples(10),
        s4={"eval_loss": 3.5, "eval_s": 0.25},
        s9={
            "eval_loss": 3.25,
            "quality": {"name": "accuracy", "value": 0.5, "direction": "higher"},
        },
    )
    telemetry_ingest(run_id=gpu_run.pk, samples=batch)
    telemetry_ingest(run_id=gpu_run.pk, samples=batch)  # resent whole
    telemetry_ingest(run_id=gpu_run.pk, samples=batch[7:])  # and a tail again
    rows = list(RunEvaluation.objects.filter(run=gpu_run).order_by("seq", "metric").values())
    assert [(r["seq"], r["metric"], r["value"], r["higher_is_better"]) for r in rows] == [
        (4, "eval_loss", 3.5, False),
        (9, "accuracy", 0.5, True),
        (9, "eval_loss", 3.25, False),
    ]
    assert (rows[0]["step"], rows[0]["tokens"], rows[0]["eval_s"]) == (4, 4000, 0.25)


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"eval_loss": math.nan}, "samples[3].eval_loss"),
        ({"eval_loss": math.inf}, "samples[3].eval_loss"),
        ({"eval_loss": -0.1}, "samples[3].eval_loss"),
        ({"eval_loss": "3.1"}, "samples[3].eval_loss"),
        ({"eval_s": -1.0}, "samples[3].eval_s"),
        ({"quality": {"name": "accuracy", "value": 0.9}}, "samples[3].quality.direction"),
        (
            {"quality": {"name": "accuracy", "value": 0.9, "direction": "up"}},
            "samples[3].quality.direction",
        ),
        (
            {"quality": {"name": "acc uracy", "value": 0.9, "direction": "higher"}},
            "samples[3].quality.name",
        ),
        (
            {"quality": {"name": "accuracy", "value": math.nan, "direction": "higher"}},
            "samples[3].quality.value",
        ),
    ],
)
def test_a_bad_evaluation_is_refused_naming_the_field_and_nothing_is_stored(
    gpu_run,  # noqa: F811
    extra,
    field,
):
    batch = samples(6)
    batch[3].update(extra)
    with pytest.raises(ApplicationError) as err:
        telemetry_ingest(run_id=gpu_run.pk, samples=batch)
    assert field in str(err.value)
    assert not TelemetrySample.objects.filter(run=gpu_run).exists()
    assert not RunEvaluation.objects.filter(run=gpu_run).exists()
