"""Celery entry points: each validates, calls one service, and returns."""

from celery import shared_task

from apps.core.queues import TaskName
from workers import signals  # noqa: F401  (registers the graceful-shutdown hook)


@shared_task(name=TaskName.PING, ignore_result=False, time_limit=10)
def ping() -> str:
    """Liveness probe: answers 'pong' from whichever worker takes it."""
    return "pong"


@shared_task(
    name=TaskName.RUN_TRAIN, acks_late=True, soft_time_limit=6 * 3600, time_limit=6 * 3600 + 120
)
def run_train(run_id: int) -> None:
    """Train one run. A missing or already-taken run returns quietly (see run_claim)."""
    from workers.training import run_execute

    run_execute(run_id)


@shared_task(name=TaskName.RUNS_SWEEP_LOST, time_limit=60)
def runs_sweep_lost() -> None:
    """Beat: runs whose worker stopped renewing its lease are marked lost and requeued or failed."""
    from apps.experiments.runs import runs_sweep_lost as sweep

    sweep()


@shared_task(name=TaskName.SERIES_BLOCKS_ROLL, time_limit=120)
def series_blocks_roll() -> None:
    """Beat: settled telemetry rolled up into the dashboard's blocks, so no page view writes."""
    from apps.dashboard.services import series_blocks_roll_due

    series_blocks_roll_due()


@shared_task(name=TaskName.TELEMETRY_MAINTAIN, time_limit=1800)
def telemetry_maintain() -> dict:
    """Beat: sample partitions made ahead and filled; retention drops the oldest."""
    from apps.ops.telemetry_upkeep import telemetry_upkeep

    return telemetry_upkeep().as_dict()


@shared_task(name=TaskName.RUNS_RECONCILE_QUEUED, time_limit=60)
def runs_reconcile_queued() -> None:
    """Beat: queued runs whose message never reached a worker (broker down or restarted)
    are sent again."""
    from apps.experiments.runs import runs_reconcile_queued as reconcile

    reconcile()


@shared_task(name=TaskName.DEVICES_PROFILE, bind=True, time_limit=300)
def devices_profile(self) -> None:
    """On demand: the training worker that takes this re-measures its devices."""
    from workers.devices import devices_measure

    queue = (self.request.delivery_info or {}).get("routing_key") or "cpu"
    devices_measure(queues=[queue])
