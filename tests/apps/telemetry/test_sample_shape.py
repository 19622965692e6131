"""One definition of a telemetry sample: gpu_runtime's SAMPLE_KEYS (what a worker's sink sends). The
ingest schema (apps.telemetry.ingest.SampleIn) and the stored row (TelemetrySample) must have
exactly those fields, so a key added in one place and forgotten in another fails here,
not in production."""

from apps.telemetry.ingest import SampleIn
from apps.telemetry.models import TelemetrySample
from gpu_runtime.telemetry import SAMPLE_KEYS

STORED_ONLY = {"id", "run", "attempt"}  # set by the platform, never sent
# An external sender's flag and its sampler's id (apps.telemetry.streams), checked at the door,
# never stored on the row.
SENT_ONLY = {"counter_reset", "stream"}
# A held-out evaluation rides on a sample, and is stored apart (apps.telemetry.evaluations): the
# runtime sends eval_loss and eval_s on the samples that carry one; quality only the SDK sends.
EVALUATION = {"eval_loss", "eval_s", "quality"}
# Training metrics and parameters ride on a sample too, stored apart (apps.telemetry.metrics,
# Run.params); only the SDK sends them.
TRAINING = {"metrics", "metrics_step", "params"}


def test_the_ingest_schema_takes_exactly_the_runtimes_sample():
    assert set(SampleIn.__annotations__) - SENT_ONLY - EVALUATION - TRAINING == set(SAMPLE_KEYS)


def test_an_evaluation_is_stored_from_the_keys_the_ingest_takes():
    from apps.telemetry.models import RunEvaluation

    assert EVALUATION <= set(SampleIn.__annotations__)
    assert {"value", "eval_s", "higher_is_better"} <= {f.name for f in RunEvaluation._meta.fields}


def test_the_stored_row_has_exactly_the_runtimes_sample_plus_its_keys():
    stored = {f.name for f in TelemetrySample._meta.concrete_fields}
    assert stored - STORED_ONLY == set(SAMPLE_KEYS)
