"""Graceful worker shutdown: training in a pool child stops at its next step boundary.

Celery's warm shutdown waits for running tasks, and a training run can take hours. On
shutdown the main process forwards SIGTERM to the pool children that are training; gpu_runtime
turns SIGTERM into a stop after the current step, and the run goes back to the queue
(run_release) with its telemetry kept, instead of waiting for a lease to expire. The task then
returns, and the warm shutdown closes the pool: a clean stop logs no lost worker.

At start, a training worker profiles its devices (workers.devices).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import psutil
from celery.signals import worker_ready, worker_shutting_down

logger = logging.getLogger(__name__)


@worker_shutting_down.connect
def forward_sigterm_to_pool_children(sig=None, how=None, exitcode=None, **kwargs) -> None:
    """SIGTERM to each pool child that is training (it stops at a step boundary and hands its run
    back); idle children and short tasks are left to the warm shutdown, which waits for them and
    closes the pool: signalled, they would die mid-job and the pool would log the clean stop as a
    lost worker (WorkerLostError, with tracebacks)."""
    from celery.worker import state

    from apps.core.queues import TaskName

    training = {
        request.worker_pid
        for request in list(state.active_requests)
        if request.name == TaskName.RUN_TRAIN and request.worker_pid
    }
    for child in psutil.Process(os.getpid()).children():
        if child.pid not in training:
            continue
        try:
            child.send_signal(signal.SIGTERM)
        except psutil.Error:
            continue
        logger.info(
            "worker shutting down (%s): asked pool process %s to stop at a step boundary",
            how,
            child.pid,
        )


@worker_ready.connect
def profile_devices_at_start(sender=None, **kwargs) -> None:
    """A training worker measures its devices as it starts, so `auto` and the authoring
    warnings read this host's hardware. A failure is recorded and logged; the worker starts."""
    from django.conf import settings

    if not settings.COSTLAB_DEVICE_PROFILE_AT_START:
        return
    try:
        queues = list(sender.app.amqp.queues.consume_from or {})
    except AttributeError:
        return
    from workers.devices import TRAINING_QUEUES, devices_measure

    if not set(queues) & TRAINING_QUEUES:
        return

    def measure() -> None:
        from django.db import connection

        try:
            devices_measure(queues=queues, in_process=False)
        except Exception:  # the database away at start: the first run measures instead
            logger.exception("profiling this worker's devices at start failed")
        finally:
            connection.close()

    # Off the main thread: the worker answers pings and takes runs meanwhile (a run before the
    # profile is recorded measures its device itself: workers.devices.run_profile).
    threading.Thread(target=measure, name="costlab-device-profile", daemon=True).start()
