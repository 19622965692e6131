"""A sweep's probe on this worker: claim it, train the candidate briefly,
hand back what was measured.

The task is the thin entry point; the proposal of the next probe happens in
apps.sweeps.probes.probe_finish, which queues it as a new task (a fan-out, never a loop here).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import time
import traceback

import psutil
from celery import shared_task

import gpu_runtime
from apps.core.queues import TaskName

logger = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = (
    0.05  # several samples per probe, so the warm-up boundary is close to warmup_steps
)
CANCEL_POLL_S = 0.5
MIB = 1024 * 1024
_process_warm = (
    False  # the first train() in a process allocates once-only runtime state (thread pools, caches)
)


def _heartbeat(probe_id: int, owner: str):
    """train()'s cancel callback: at most every CANCEL_POLL_S,
    renew the probe and learn whether to stop."""
    from apps.sweeps.probes import probe_heartbeat

    last = [0.0, False]

    def cancelled() -> bool:
        now = time.monotonic()
        if not last[1] and now - last[0] >= CANCEL_POLL_S:
            try:
                last[0], last[1] = now, probe_heartbeat(probe_id=probe_id, owner=owner)
            except Exception as exc:  # the database is away: keep training; the reconciler decides
                logger.warning("probe %s: heartbeat failed (%s)", probe_id, exc)
                last[0] = now
        return last[1]

    return cancelled


def _warm_process(config, device: str, cancel) -> None:
    """One untelemetered step, once per process,
    so the first probe's memory and time are not the runtime's; a cancel asked meanwhile
    stops it before its step (the probe then ends at once, without a step of its own)."""
    global _process_warm
    if _process_warm:
        return
    quiet = config.model_copy(
        update={"telemetry": config.telemetry.model_copy(update={"enabled": False})}
    )
    warmed = True  # a strategy that fails here: the probe itself will say what is wrong with it
    with contextlib.suppress(Exception):
        # a cancel before its step leaves the process cold, for the next probe to warm it
        warmed = gpu_runtime.train(quiet, device=device, steps=1, cancel=cancel).status == (
            "completed"
        )
    _process_warm = warmed


def _return_freed_memory() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _failure_reason(exc: BaseException) -> str:
    import torch

    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return f"out of memory: {str(exc).splitlines()[0][:500]}"
    if isinstance(exc, gpu_runtime.StrategyError):
        return "strategy refused: " + "; ".join(f"{e['key']}: {e['message']}" for e in exc.errors)
    return f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"


def probe_execute(probe_id: int) -> None:
    """Train one probe to its end; its row says what was measured, or why it is infeasible."""
    import torch

    from apps.core.db import db_retry
    from apps.core.leases import lease_owner_id
    from apps.sweeps import probes
    from apps.sweeps.space import RESOURCE_KEYS
    from workers.training import _device_for

    owner = lease_owner_id()
    probe = db_retry(
        probes.probe_claim, what=f"probe {probe_id}: claim", probe_id=probe_id, owner=owner
    )
    if probe is None:
        logger.info("probe %s: not claimable (gone, taken or its sweep stopped)", probe_id)
        return
    sweep = probe.sweep
    device, _, gpu_count = _device_for(sweep.queue)  # a probe trains in one process
    threads_before = torch.get_num_threads()
    samples: list[dict] = []
    outcome: dict = {"device": device, "gpu_count": gpu_count}
    try:
        config = gpu_runtime.load_strategy(probe.strategy_yaml)
        config = config.model_copy(
            update={
                "telemetry": config.telemetry.model_copy(
                    update={"enabled": True, "interval_s": SAMPLE_INTERVAL_S}
                )
            }
        )
        threads = probe.params.get(RESOURCE_KEYS[0])
        if threads:
            torch.set_num_threads(int(threads))
        if device.startswith("cuda"):
            torch.cuda.set_per_process_memory_fraction(float(sweep.tenant.gpu_memory_fraction))
            torch.cuda.empty_cache()
        outcome["vcpus"] = 0 if gpu_count else torch.get_num_threads()
        cancelled = _heartbeat(probe_id, owner)
        _warm_process(config, device, cancelled)
        # so the probe's RSS growth on CPU is its own, not refilled free lists
        _return_freed_memory()
        outcome["baseline_mem_mb"] = psutil.Process().memory_info().rss / MIB
        result = gpu_runtime.train(
            config,
            sink=samples.append,
            cancel=cancelled,
            device=device,
            steps=sweep.warmup_steps + sweep.probe_steps,
        )
        outcome.update(samples=samples, result=result, cancelled=result.status != "completed")
    except (
        Exception
    ) as exc:  # OOM, a refused combination, a crash: infeasible, and the sweep goes on
        outcome["error"] = _failure_reason(exc)
        logger.info("probe %s infeasible: %s", probe_id, outcome["error"].splitlines()[0])
    finally:
        torch.set_num_threads(threads_before)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    db_retry(
        probes.probe_finish,
        what=f"probe {probe_id}: finish",
        probe_id=probe_id,
        owner=owner,
        **outcome,
    )


@shared_task(name=TaskName.PROBES_RECONCILE, time_limit=60)
def probes_reconcile() -> None:
    """Beat: lost probes become infeasible (the sweep goes on);
    unsent queued probes are sent again."""
    from apps.sweeps.probes import probes_reconcile as reconcile

    reconcile()


@shared_task(name=TaskName.SWEEP_PROBE, acks_late=True, soft_time_limit=3600, time_limit=3600 + 120)
def sweep_probe(probe_id: int) -> None:
    """Train one probe of a sweep; a missing, taken or cancelled probe returns quietly."""
    probe_execute(probe_id)
