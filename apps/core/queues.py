"""Celery's names that must match across workers, settings and services: queues and tasks, in one
place; and the one way a service sends a wake-up message."""

import logging
from enum import StrEnum

logger = logging.getLogger(__name__)


class CeleryQueue(StrEnum):
    DEFAULT = "default"  # attribution tick, sweeper, housekeeping
    CPU = "cpu"
    GPU = "gpu"
    ALERTS = "alerts"  # webhook/mail deliveries: a slow receiver never holds up the tick


class TaskName(StrEnum):
    """Registered task names: the workers register them, settings route and schedule them,
    services send them."""

    PING = "costlab.ping"
    RUN_TRAIN = "costlab.run_train"
    RUNS_SWEEP_LOST = "costlab.runs_sweep_lost"
    RUNS_RECONCILE_QUEUED = "costlab.runs_reconcile_queued"
    ATTRIBUTION_TICK = "costlab.attribution_tick"
    ALERT_DELIVER = "costlab.alert_deliver"
    ALERTS_REQUEUE_STALE = "costlab.alerts_requeue_stale"
    SWEEP_PROBE = "costlab.sweep_probe"
    PROBES_RECONCILE = "costlab.probes_reconcile"
    SERIES_BLOCKS_ROLL = "costlab.series_blocks_roll"
    TELEMETRY_MAINTAIN = "costlab.telemetry_maintain"
    DEVICES_PROFILE = "costlab.devices_profile"


def task_send(task: TaskName, *, args: list, queue: str, priority: int | None = None) -> bool:
    """Publish a task on its own connection with one quick retry;
    False (logged) when the broker is away.

    For wake-ups whose truth is a database row (a queued run, a queued probe): a submit must not
    hang on a broker outage, and a reconciler on beat sends again what never arrived.
    `priority`: Celery's Redis priority (0 first, settings' priority_steps), None the default.
    """
    from celery import current_app as app  # config's app, the default in every thread

    try:
        with app.connection_for_write(
            transport_options={"max_retries": 1, "interval_start": 0.2}
        ) as conn:
            app.send_task(
                task,
                args=args,
                queue=queue,
                retry=False,
                ignore_result=True,
                connection=conn,
                **({} if priority is None else {"priority": priority}),
            )
    except Exception as exc:  # kombu/redis errors differ by transport; all mean "not sent"
        logger.warning(
            "%s%s: could not send it to queue %s (%s: %s); the reconciler will send it again",
            task,
            args,
            queue,
            type(exc).__name__,
            exc,
        )
        return False
    return True
