"""Celery's names that must match across workers, settings and services: queues and tasks, in one place."""

from enum import StrEnum


class CeleryQueue(StrEnum):
    DEFAULT = "default"  # attribution tick, sweeper, housekeeping
    CPU = "cpu"
    GPU = "gpu"
    ALERTS = "alerts"  # webhook/mail deliveries: a slow receiver never holds up the tick


class TaskName(StrEnum):
    """Registered task names: the workers register them, settings route and schedule them, services send them."""

    PING = "costlab.ping"
    RUN_TRAIN = "costlab.run_train"
    RUNS_SWEEP_LOST = "costlab.runs_sweep_lost"
    RUNS_RECONCILE_QUEUED = "costlab.runs_reconcile_queued"
    ATTRIBUTION_TICK = "costlab.attribution_tick"
    ALERT_DELIVER = "costlab.alert_deliver"
    ALERTS_REQUEUE_STALE = "costlab.alerts_requeue_stale"
    SWEEP_PROBE = "costlab.sweep_probe"
    PROBES_RECONCILE = "costlab.probes_reconcile"
