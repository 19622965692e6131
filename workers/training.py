"""Execute one run on this worker: claim, train with gpu_runtime, stream telemetry, finish.

The task in workers.tasks is the thin entry point; the run's state changes go through
apps.experiments.leases, telemetry through apps.telemetry.services.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import traceback
import uuid

from apps.experiments import leases
from apps.telemetry.services import telemetry_ingest
from workers.telemetry_sink import TelemetrySink

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # also the cancel latency bound: a cancel is seen within about a second


class RunControl:
    """Heartbeat thread: keeps the lease fresh and turns a cancel (or a lost lease) into a stop."""

    def __init__(self, *, run_id: int, owner: str):
        self.run_id, self.owner = run_id, owner
        self.stop_requested = threading.Event()
        self.lease_lost = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"run-control-{run_id}", daemon=True)
        self._thread.start()

    def should_stop(self) -> bool:
        return self.stop_requested.is_set()

    def close(self) -> None:
        self._done.set()
        self._thread.join(5)

    def _loop(self) -> None:
        from django.db import close_old_connections, connection

        try:
            while not self._done.wait(HEARTBEAT_S):
                try:
                    close_old_connections()
                    state = leases.run_heartbeat(run_id=self.run_id, owner=self.owner)
                except Exception as exc:  # the database is away: keep training, the lease decides
                    logger.warning("run %s: heartbeat failed (%s)", self.run_id, exc)
                    connection.close()
                    continue
                if not state.held:
                    self.lease_lost = True
                if state.cancel or not state.held:
                    self.stop_requested.set()
        finally:
            connection.close()


def _device_for(queue: str) -> tuple[str, str | None, int]:
    import torch

    if queue == "gpu" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        return f"cuda:{index}", torch.cuda.get_device_name(index), 1
    return "cpu", None, 0


def run_execute(run_id: int) -> None:
    """Train one run to its end; the row says truthfully how it ended."""
    import torch

    import gpu_runtime
    from apps.experiments.models import Run

    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    run = leases.run_claim(run_id=run_id, owner=owner)
    if run is None:
        logger.info("run %s: not claimable (gone, taken, cancelled or out of attempts)", run_id)
        return
    device, gpu_name, gpu_count = _device_for(run.queue)
    if device.startswith("cuda"):
        # Tenants are isolated by process (one task per child) and by this memory cap.
        torch.cuda.set_per_process_memory_fraction(float(run.tenant.gpu_memory_fraction))
    leases.run_device_record(
        run_id=run.pk, owner=owner, host=socket.gethostname(),
        device=f"{device} {gpu_name}" if gpu_name else device, gpu_name=gpu_name, gpu_count=gpu_count,
        vcpus=torch.get_num_threads() if not gpu_count else 0, memory_gb=0.0,
    )
    sink = TelemetrySink(run_id=run.pk, attempt=run.attempts, seq_base=run.last_seq + 1, ingest=telemetry_ingest)
    control = RunControl(run_id=run.pk, owner=owner)
    status, error, dataset_sha, result_status = Run.Status.FAILED, "", "", ""
    try:
        config = gpu_runtime.load_strategy(run.config_yaml)
        result = gpu_runtime.train(config, sink=sink.put, cancel=control.should_stop, device=device)
        dataset_sha, result_status = result.dataset_sha256 or "", result.status
        if result.status == "completed":
            status = Run.Status.SUCCEEDED
        elif result.status == "cancelled" and not control.lease_lost:
            status = Run.Status.CANCELLED
        else:
            status = None  # interrupted (worker shutting down) or lease lost: not ours to end
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        logger.exception("run %s failed", run_id)
    finally:
        control.close()
        sink.close()
    if status is None:
        if not control.lease_lost:
            leases.run_release(run_id=run.pk, owner=owner, reason="worker stopped before the run finished")
        if result_status == "interrupted":
            # gpu_runtime took SIGTERM to stop at a step boundary; hand it back to this process's
            # own handler (Celery's) so the shutdown that sent it carries on.
            signal.raise_signal(signal.SIGTERM)
        return
    leases.run_finish(run_id=run.pk, owner=owner, status=status, error=error, dataset_sha256=dataset_sha)
