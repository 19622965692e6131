"""Execute one run on this worker: claim, train with gpu_runtime, stream telemetry, finish.

The task in workers.tasks is the thin entry point; the run's state changes go through
apps.experiments.runs, telemetry through apps.telemetry.services. Every database call on this
(main) thread goes through db_retry: a connection that died with a database restart is replaced,
and the call repeated (the run services are idempotent for their owner).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import traceback
import uuid

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

import gpu_runtime
from apps.core.db import db_retry
from apps.core.notify import ARM_REVISIONS, listen
from apps.core.queues import CeleryQueue
from apps.experiments import runs
from apps.telemetry.services import telemetry_ingest
from gpu_runtime.live import live_changes
from workers.telemetry_sink import TelemetrySink

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # also the cancel latency bound: a cancel is seen within about a second


class RunControl:
    """Heartbeat thread: keeps the lease fresh, turns a cancel (or a lost lease) into a stop,
    and brings an arm's new revision to the trainer, which takes its live keys at a step boundary.

    Redis pub/sub wakes it as soon as a revision is committed; without Redis it polls every second.
    """

    def __init__(self, *, run_id: int, owner: str, arm_id: int, revision: int, config):
        self.run_id, self.owner, self.arm_id = run_id, owner, arm_id
        self.revision, self.config = revision, config
        self.stop_requested = threading.Event()
        self.lease_lost = False
        self._done = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._pending: tuple[int, dict, list[str]] | None = None
        self._handed: list[tuple[int, dict, list[str], object]] = []
        self._stop_listening = listen(ARM_REVISIONS, self._on_revision_pushed)
        self._thread = threading.Thread(target=self._loop, name=f"run-control-{run_id}", daemon=True)
        self._thread.start()

    def should_stop(self) -> bool:
        return self.stop_requested.is_set()

    def live_updates(self) -> dict | None:
        """Called by the trainer before a step: the live keys to apply now, if a revision brought any."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return None
            revision, live, not_applied = pending
            self._handed.append((revision, live, not_applied, timezone.now()))
        self._wake.set()  # record it without waiting for the next heartbeat
        return live

    def record_revisions(self) -> None:
        """Record the revisions handed to the trainer, before the run ends (the lease is needed)."""
        try:
            db_retry(self._record_handed, what=f"run {self.run_id}: record revisions", budget_s=30)
        except Exception as exc:  # bookkeeping only: never let it stop the run from being finished
            logger.warning("run %s: could not record applied revisions (%s)", self.run_id, exc)

    def close(self) -> None:
        """Stop the heartbeat. Called after the run's end is recorded: until then the lease stays fresh."""
        if self._stop_listening:
            self._stop_listening()
        self._done.set()
        self._wake.set()
        self._thread.join(5)

    def _on_revision_pushed(self, message: str) -> None:
        arm_id, _, revision = message.partition(":")
        if arm_id == str(self.arm_id) and int(revision or 0) > self.revision:
            self._wake.set()

    def _loop(self) -> None:
        try:
            while not self._done.is_set():
                self._wake.wait(HEARTBEAT_S)
                self._wake.clear()
                if self._done.is_set():
                    break
                try:
                    close_old_connections()
                    self._tick()
                except Exception as exc:  # the database is away: keep training, the lease decides
                    logger.warning("run %s: heartbeat failed (%s)", self.run_id, exc)
                    connection.close()
        finally:
            connection.close()

    def _tick(self) -> None:
        state = runs.run_heartbeat(run_id=self.run_id, owner=self.owner)
        if not state.held:
            self.lease_lost = True
        if state.cancel or not state.held:
            self.stop_requested.set()
        if state.revision > self.revision:
            revision, strategy_yaml = runs.arm_strategy(arm_id=self.arm_id)
            new_config = gpu_runtime.load_strategy(strategy_yaml)
            live, not_applied = live_changes(self.config, new_config)
            self.config, self.revision = new_config, revision
            with self._lock:
                if live:
                    self._pending = (revision, live, not_applied)
                else:  # nothing a running job can take: say so on the run, now
                    self._handed.append((revision, {}, not_applied, timezone.now()))
        self._record_handed()

    def _record_handed(self) -> None:
        with self._lock:
            handed, self._handed = self._handed, []
        for revision, live, not_applied, applied_at in handed:
            runs.run_revision_applied(run_id=self.run_id, owner=self.owner, revision=revision, live=live,
                                        not_applied=not_applied, applied_at=applied_at)


def _device_for(queue: str, world_size: int = 1) -> tuple[str, str | None, int]:
    """The device this worker trains the run on, its GPU name, and the GPUs the run holds.

    A DDP run (world_size > 1) asks for a bare ``cuda``: gpu_runtime's placement picks its GPUs.
    """
    import torch

    if queue == CeleryQueue.GPU and torch.cuda.is_available():
        index = torch.cuda.current_device()
        if world_size > 1:
            return "cuda", torch.cuda.get_device_name(index), world_size
        return f"cuda:{index}", torch.cuda.get_device_name(index), 1
    return "cpu", None, 0


def run_execute(run_id: int) -> None:
    """Train one run to its end; the row says truthfully how it ended."""
    import torch

    from apps.experiments.models import Run
    from gpu_runtime.distributed import threads_per_rank

    host = socket.gethostname()
    owner = f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    run = db_retry(runs.run_claim, what=f"run {run_id}: claim", run_id=run_id, owner=owner, host=host)
    if run is None:
        logger.info("run %s: not claimable (gone, taken, cancelled or out of attempts)", run_id)
        return
    world = run.world_size
    device, gpu_name, gpu_count = _device_for(run.queue, world)
    if device.startswith("cuda:"):
        # Tenants are isolated by process (one task per child) and by this memory cap.
        torch.cuda.set_per_process_memory_fraction(float(run.tenant.gpu_memory_fraction))
    label = f"{device} {gpu_name}" if gpu_name else device
    db_retry(runs.run_device_record, what=f"run {run_id}: device record",
             run_id=run.pk, owner=owner, host=host, device=label if world == 1 else f"{label} x{world}",
             gpu_name=gpu_name, gpu_count=gpu_count,
             vcpus=0 if gpu_count else threads_per_rank(world) * world if world > 1 else torch.get_num_threads(),
             memory_gb=0.0)
    sink = TelemetrySink(run_id=run.pk, attempt=run.attempts, seq_base=run.last_seq + 1, ingest=telemetry_ingest)
    status, error, dataset_sha, result_status = Run.Status.FAILED, "", "", ""
    control = None
    try:
        try:
            config = gpu_runtime.load_strategy(run.config_yaml)
            control = RunControl(run_id=run.pk, owner=owner, arm_id=run.arm_id, revision=run.config_revision,
                                 config=config)
            result = gpu_runtime.train(config, sink=sink.put, cancel=control.should_stop, device=device,
                                       live=control.live_updates)
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
            # Every measured sample is stored before the run's end is recorded, through an outage too.
            sink.close(timeout_s=settings.COSTLAB_WORKER_DB_RETRY_S)
        lease_lost = control is not None and control.lease_lost
        if control is not None:
            control.record_revisions()
        if status is not None:
            db_retry(runs.run_finish, what=f"run {run_id}: finish", run_id=run.pk, owner=owner, status=status,
                     error=error, dataset_sha256=dataset_sha)
        elif not lease_lost:
            db_retry(runs.run_release, what=f"run {run_id}: release", run_id=run.pk, owner=owner,
                     reason="worker stopped before the run finished")
    finally:
        if control is not None:
            control.close()  # the heartbeat kept the lease fresh while the end was being recorded
    if result_status == "interrupted":
        # gpu_runtime took SIGTERM to stop at a step boundary; hand it back to this process's
        # own handler (Celery's) so the shutdown that sent it carries on.
        signal.raise_signal(signal.SIGTERM)
