"""Issue 25: a ci run submitted behind a queue of batch runs is the next one a real worker takes
(Celery's Redis priorities), and the API says where a queued run stands."""

import pytest

from apps.experiments.models import Run
from apps.experiments.selectors import queue_places
from apps.experiments.services import run_submit
from tests.helpers import start_worker, stop_worker, wait_for
from tests.workers.test_runs_on_a_worker import SHORT, experiment_with

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_ci_run_submitted_behind_ten_batch_runs_starts_next():
    experiment = experiment_with(SHORT)
    experiment.tenant.max_concurrent_runs = 100
    experiment.tenant.save()
    batch = [run_submit(experiment=experiment, priority=Run.Priority.BATCH) for _ in range(10)]
    ci = run_submit(experiment=experiment, priority=Run.Priority.CI)
    # Before any worker: the ci run is first in line, the batch runs behind it in their order.
    places = queue_places()
    assert places[ci.pk].position == 1
    assert [places[r.pk].position for r in batch] == list(range(2, 12))
    proc, _ = start_worker(queues="cpu", concurrency=1)
    try:
        started = wait_for(
            lambda: Run.objects.filter(pk=ci.pk, status="succeeded").first(), 120, "the ci run"
        )
        # No batch run started before the ci run: it jumped the ten already waiting.
        earlier = Run.objects.filter(
            pk__in=[r.pk for r in batch], started_at__lt=started.started_at
        )
        assert not earlier.exists(), list(earlier.values_list("pk", "started_at"))
    finally:
        Run.objects.filter(pk__in=[r.pk for r in batch]).update(cancel_requested=True)
        stop_worker(proc)
