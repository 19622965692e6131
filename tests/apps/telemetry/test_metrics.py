"""Training metrics and parameters ride on telemetry samples: metrics stored once per (run, seq,
name) at their step, parameters merged into the run once per sample; a bad one is refused naming
the field, with nothing stored."""

import math

import pytest

from apps.billing.services import telemetry_ingest
from apps.core.exceptions import ApplicationError
from apps.experiments.models import Run
from apps.telemetry.models import RunMetric, TelemetrySample
from tests.apps.billing.test_ingest import gpu_run, samples  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def test_metrics_are_stored_once_per_seq_and_params_merged_once(gpu_run):  # noqa: F811
    batch = samples(10)
    batch[3] |= {"metrics": {"loss": 2.5, "grad_norm": 0.75, "learning_rate": 3e-4}}
    batch[6] |= {"metrics": {"loss": 2.25, "train/loss": 2.0}, "metrics_step": 5}
    batch[2] |= {"params": {"hyperparameters": {"learning_rate": 3e-4, "optim": {"name": "adamw"}}}}
    batch[8] |= {"params": {"hyperparameters": {"seed": 1}, "model": {"hidden_size": 64}}}
    telemetry_ingest(run_id=gpu_run.pk, samples=batch)
    telemetry_ingest(run_id=gpu_run.pk, samples=batch)  # resent whole
    telemetry_ingest(run_id=gpu_run.pk, samples=batch[5:])  # and a tail again
    rows = list(
        RunMetric.objects.filter(run=gpu_run)
        .order_by("seq", "name")
        .values_list("seq", "step", "tokens", "name", "value")
    )
    assert rows == [
        (3, 3, 3000, "grad_norm", 0.75),
        (3, 3, 3000, "learning_rate", 3e-4),
        (3, 3, 3000, "loss", 2.5),
        (6, 5, 6000, "loss", 2.25),  # at the step the training named, not the sample's
        (6, 5, 6000, "train/loss", 2.0),
    ]
    params = {
        "hyperparameters": {"learning_rate": 3e-4, "optim": {"name": "adamw"}, "seed": 1},
        "model": {"hidden_size": 64},
    }
    assert Run.objects.get(pk=gpu_run.pk).params == params
    # A later report replaces the key it names; a repeat of the earlier batch merges nothing again.
    later = samples(2, start=10)
    later[0] |= {"params": {"hyperparameters": {"learning_rate": 1e-3}}}
    telemetry_ingest(run_id=gpu_run.pk, samples=later)
    telemetry_ingest(run_id=gpu_run.pk, samples=batch)
    params["hyperparameters"]["learning_rate"] = 1e-3
    assert Run.objects.get(pk=gpu_run.pk).params == params


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"metrics": {"loss": math.nan}}, "samples[3].metrics.loss"),
        ({"metrics": {"loss": "2.1"}}, "samples[3].metrics.loss"),
        ({"metrics": {"top 1": 0.5}}, "samples[3].metrics.top 1"),
        ({"params": {"hyperparameters": {"big": "x" * 70_000}}}, "samples[3].params"),
    ],
)
def test_a_bad_metric_or_params_is_refused_naming_the_field(gpu_run, extra, field):  # noqa: F811
    batch = samples(6)
    batch[3].update(extra)
    with pytest.raises(ApplicationError) as err:
        telemetry_ingest(run_id=gpu_run.pk, samples=batch)
    assert field in str(err.value)
    assert not TelemetrySample.objects.filter(run=gpu_run).exists()
    assert not RunMetric.objects.filter(run=gpu_run).exists()
    assert Run.objects.get(pk=gpu_run.pk).params == {}
