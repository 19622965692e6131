"""Graceful worker shutdown: training in a pool child stops at its next step boundary.

Celery's warm shutdown waits for running tasks, and a training run can take hours. On
shutdown the main process forwards SIGTERM to its pool children; gpu_runtime turns SIGTERM
into a stop after the current step, and the run goes back to the queue (run_release) with
its telemetry kept, instead of waiting for a lease to expire.

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
    for child in psutil.Process(os.getpid()).children():
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
