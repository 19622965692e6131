"""Graceful worker shutdown: training in a pool child stops at its next step boundary.

Celery's warm shutdown waits for running tasks, and a training run can take hours. On
shutdown the main process forwards SIGTERM to its pool children; gpu_runtime turns SIGTERM
into a stop after the current step, and the run goes back to the queue (run_release) with
its telemetry kept, instead of waiting for a lease to expire.
"""

from __future__ import annotations

import logging
import os
import signal

import psutil
from celery.signals import worker_shutting_down

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
