"""A forward stamp never costs the samples after it (issue 45's audit: one sample +25 s ahead lost
the next four true batches; one an hour ahead in an upload billed 3x and lost half the tokens).
Order within a run is by seq: the forward stamp is pulled back, the true samples are stored."""

import pytest

from apps.billing.services import telemetry_ingest
from apps.telemetry.models import TelemetrySample
from tests.apps.billing.test_ingest import gpu_run, samples  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def send(run, batch, size):
    results = [
        telemetry_ingest(run_id=run.pk, samples=batch[i : i + size])
        for i in range(0, len(batch), size)
    ]
    assert all(r.refused == [] for r in results), [r.refused for r in results]
    return results


@pytest.mark.parametrize(
    "n, forward_seq, ahead_s, batch",
    [
        (35, 12, 25.0, 5),  # a live run's clock jumped 25 s ahead for one sample
        (121, 30, 3600.0, 20),  # an upload with one sample stamped an hour ahead
        (40, 39, 25.0, 7),  # the last sample: nothing after it to pull it back
    ],
)
def test_a_forward_stamp_loses_no_later_sample(gpu_run, n, forward_seq, ahead_s, batch):  # noqa: F811
    sent = samples(n)  # one second apart, 1000 tokens and 300 J a second
    sent[forward_seq]["ts"] += ahead_s
    send(gpu_run, sent, batch)
    gpu_run.refresh_from_db()
    assert TelemetrySample.objects.filter(run=gpu_run).count() == n
    assert gpu_run.tokens == 1000 * (n - 1)  # every true sample's tokens
    span = (n - 1) + (ahead_s if forward_seq == n - 1 else 0.0)
    assert gpu_run.device_seconds == pytest.approx(span)  # the true span, not the jump
    if forward_seq < n - 1:
        assert gpu_run.cost_breakdown["clock_skew_samples"] >= 1
        stamp = TelemetrySample.objects.get(run=gpu_run, seq=forward_seq).ts.timestamp()
        assert stamp == pytest.approx(sent[forward_seq + 1]["ts"])  # pulled back


def test_a_forward_stamp_inside_one_batch_is_pulled_back_before_it_is_stored(gpu_run):  # noqa: F811
    sent = samples(10)
    sent[4]["ts"] += 60.0
    send(gpu_run, sent, 10)
    gpu_run.refresh_from_db()
    assert gpu_run.device_seconds == pytest.approx(9.0) and gpu_run.tokens == 9000
