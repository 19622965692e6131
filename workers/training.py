"""Execute one run on this worker: claim, train with gpu_runtime, stream telemetry, finish.

The task in workers.tasks is the thin entry point; the run's state changes go through
apps.experiments.runs, telemetry through apps.billing.services. Every database call on this
(main) thread goes through db_retry: a connection that died with a database restart is replaced,
and the call repeated (the run services are idempotent for their owner).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

import gpu_runtime
from apps.billing.interface import telemetry_ingest
from apps.core.db import db_retry
from apps.core.exceptions import ApplicationError
from apps.core.leases import lease_owner_id
from apps.core.notify import ARM_REVISIONS, RUN_CANCELS, listen
from apps.core.queues import CeleryQueue
from apps.experiments import runs
from apps.experiments.resources import resource_id_check
from gpu_runtime.capability import resolve_device
from gpu_runtime.device_keys import resolve_device_keys
from gpu_runtime.kernels.compiling import CACHE_URL_ENV
from gpu_runtime.live import live_changes
from gpu_runtime.profile import DeviceProfile
from gpu_runtime.runtime import stop_on_sigterm
from workers.devices import run_profile
from workers.telemetry_sink import TelemetrySink

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # also the cancel latency bound: a cancel is seen within about a second
# An AWS (Nitro) instance's id, as its hypervisor writes it into the board's DMI asset tag: a file
# read, where a cloud's metadata endpoint is a network call that could hang a worker elsewhere.
AWS_ASSET_TAG = Path("/sys/devices/virtual/dmi/id/board_asset_tag")
_AWS_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")


class RunControl:
    """Heartbeat thread: keeps the lease fresh, turns a cancel (or a lost lease) into a stop,
    and brings an arm's new revision to the trainer, which takes its live keys at a step boundary.

    Redis pub/sub wakes it as soon as a revision or a cancel is committed; without Redis it polls
    every second.
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
        self._stop_listening = listen(
            {ARM_REVISIONS: self._on_revision_pushed, RUN_CANCELS: self._on_cancel_pushed}
        )
        self._thread = threading.Thread(
            target=self._loop, name=f"run-control-{run_id}", daemon=True
        )
        self._thread.start()

    def should_stop(self) -> bool:
        return self.stop_requested.is_set()

    def live_updates(self) -> dict | None:
        """Called by the trainer before a step: the live keys to apply now, if a revision brought
        any."""
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
        """Stop the heartbeat. Called after the run's end is recorded: until then the lease stays
        fresh."""
        if self._stop_listening:
            self._stop_listening()
        self._done.set()
        self._wake.set()
        self._thread.join(5)

    def _on_revision_pushed(self, message: str) -> None:
        arm_id, _, revision = message.partition(":")
        if arm_id == str(self.arm_id) and int(revision or 0) > self.revision:
            self._wake.set()

    def _on_cancel_pushed(self, message: str) -> None:
        if str(self.run_id) in message.split(","):
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
            runs.run_revision_applied(
                run_id=self.run_id,
                owner=self.owner,
                revision=revision,
                live=live,
                not_applied=not_applied,
                applied_at=applied_at,
            )


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


def _device_keys(config_yaml: str, device: str, profile) -> tuple[str, dict]:
    """The dtype the run computes in, and what each `auto` key of its strategy becomes on this
    device and why ({key: {requested, resolved, why}}): gpu_runtime's own resolution, on the
    profile the runtime is handed (or the one it would measure, kept for it), so the two agree.
    ("", {}) when the strategy no longer validates: refused again where it trains, with the
    reason."""
    try:
        config = gpu_runtime.load_strategy(config_yaml)
    except gpu_runtime.StrategyError:
        return "", {}
    try:
        config, reports = resolve_device_keys(config, resolve_device(device), profile)
    except Exception as exc:  # the device could not be measured: the runtime fails the run with it
        logger.warning("device keys not resolved before training on %s: %s", device, exc)
        dtype = config.precision.compute_dtype
        return ("" if dtype == "auto" else dtype), {}
    resolved = {
        key: {name: report[name] for name in ("requested", "resolved", "why")}
        for key, report in reports.items()
    }
    return config.precision.compute_dtype, resolved


# What the run page and the API show of kernels.compile, beside requested/resolved/why.
COMPILE_FIELDS = (
    "requested",
    "resolved",
    "why",
    "mode",
    "cache",
    "compile_s",
    "eager_step_s",
    "compiled_step_s",
    "measured_speedup",
    "decided_at_step",
    "fallback",
    "recompiles",
)


def _decided_in_the_run(strategies: dict) -> dict | None:
    """kernels.compile as the run ended: compiled, loaded from the cache or eager, the seconds
    it took, and the payback rule's decision and inputs (gpu_runtime.kernels.compiling)."""
    report = strategies.get("kernels.compile")
    if not report or "mode" not in report:
        return None
    out = {name: report.get(name) for name in COMPILE_FIELDS}
    out["cache_where"] = (report.get("cache_backend") or {}).get("why")
    decision = report.get("decision")
    if decision:
        out["expected_saving_s"] = decision["expected_saving_s"]
        out["expected_cost_s"] = decision["expected_cost_s"]
        out["estimated"] = decision["figures"]["estimated"]
    return {"kernels.compile": out}


def _yaml_value(value) -> str:
    """A resolved value as the strategy's YAML writes it (true/false, 8, bf16)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def run_execute(run_id: int) -> None:
    """Train one run to its end; the row says truthfully how it ended.

    SIGTERM, from the claim until training takes it over, only sets a flag (gpu_runtime's
    stop_on_sigterm): the run is then handed back to the queue instead of being left running by
    a pool child killed mid-claim, mid-measurement or mid-setup. Afterwards the held signal goes
    on to a handler installed before, so the shutdown that sent it carries on; in a Celery pool
    child (the worker's warm shutdown sent it, workers.signals, and closes the pool itself) the
    task returns instead: billiard's handler would exit the child mid-job and the pool would log
    the clean stop as a lost worker."""
    with stop_on_sigterm() as stopped:
        seat = _run_execute(run_id, stopped)
    if stopped.is_set():
        _sigterm_on()
        return
    if seat is not None:
        _train_as_node(run_id, seat)


def _sigterm_on() -> None:
    """The SIGTERM a training stop held, handed on to a handler installed before it. Not to a
    Celery pool child's own (billiard's exit on SIGTERM) nor the default action: the warm
    shutdown that sent it closes the pool, and an exit here mid-job is logged as a lost worker."""
    handler = signal.getsignal(signal.SIGTERM)
    if handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        return
    if getattr(handler, "__module__", "").startswith("billiard"):
        return
    signal.raise_signal(signal.SIGTERM)


def _release(run_id: int, owner: str, reason: str) -> None:
    db_retry(
        runs.run_release, what=f"run {run_id}: release", run_id=run_id, owner=owner, reason=reason
    )


def resource_id(run_id: int) -> str:
    """The cloud resource this worker runs on, recorded on the run for billing's reconciliation:
    COSTLAB_RESOURCE_ID, else an AWS instance's id from its DMI asset tag, else "" (nothing is asked
    of a metadata endpoint). A malformed COSTLAB_RESOURCE_ID is logged with the reason and not
    recorded: the run trains all the same."""
    said = settings.COSTLAB_RESOURCE_ID
    if said:
        try:
            return resource_id_check(said, field="COSTLAB_RESOURCE_ID")
        except ApplicationError as exc:
            logger.error("run %s: no cloud resource recorded: %s", run_id, exc.message)
            return ""
    try:
        tag = AWS_ASSET_TAG.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""
    return tag if _AWS_INSTANCE_ID.fullmatch(tag) else ""


def _artifacts_dir(run_id: int, config) -> str | None:
    """The run's artifacts directory (made now) when its strategy saves what it trained
    (finetune.save); None otherwise."""
    if not config.finetune.save:
        return None
    path = runs.run_artifacts_dir(run_id)
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _run_execute(run_id: int, stopped: threading.Event):
    """The run's whole life on this node; returns the gang seat when another node claimed it."""
    from apps.experiments.models import Run

    host = socket.gethostname()
    owner = lease_owner_id(host)
    run = db_retry(
        runs.run_claim, what=f"run {run_id}: claim", run_id=run_id, owner=owner, host=host
    )
    if run is None:
        seat = _gang_seat(run_id)
        if seat is None:
            logger.info("run %s: not claimable (gone, taken, cancelled or out of attempts)", run_id)
        return seat
    device, gpu_name, gpu_count = _take_device(run)
    _share_compile_cache()
    profile = _record_device(run_id, run, owner, host, device, gpu_name, gpu_count)
    if stopped.is_set():  # the worker is shutting down: the run goes back to the queue untouched
        _release(run.pk, owner, "worker stopped before the run started training")
        return None
    rendezvous, gang = None, None
    # this node claimed a run across nodes: it hosts the rendezvous, the others join
    if run.nnodes > 1:
        rendezvous = _host_rendezvous(run, owner)
        gang = _GangCall(run)
    sink = TelemetrySink(
        run_id=run.pk,
        attempt=run.attempts,
        seq_base=run.last_seq + 1,
        ingest=telemetry_ingest,
        seq_stride=run.nnodes,
    )
    attempt = _Attempt(status=Run.Status.FAILED)
    try:
        _train(
            run_id,
            run,
            attempt,
            owner=owner,
            device=device,
            profile=profile,
            rendezvous=rendezvous,
            gang=gang,
            sink=sink,
            stopped=stopped,
        )
        _record_end(run_id, run, owner, attempt)
    finally:
        if attempt.control is not None:
            # the heartbeat kept the lease fresh while the end was being recorded
            attempt.control.close()
    if attempt.result_status == "interrupted":
        # gpu_runtime took SIGTERM to stop at a step boundary; run_execute hands it on.
        stopped.set()
    return None


def _take_device(run) -> tuple[str, str | None, int]:
    """The device this worker trains the run on, its GPU name and GPU count, a single GPU capped
    at the tenant's memory fraction."""
    import torch

    device, gpu_name, gpu_count = _device_for(run.queue, run.world_size)
    if device.startswith("cuda:"):
        # Tenants are isolated by process (one task per child) and by this memory cap.
        torch.cuda.set_per_process_memory_fraction(float(run.tenant.gpu_memory_fraction))
    return device, gpu_name, gpu_count


def _share_compile_cache() -> None:
    """Point the runtime at the configured compile cache, if any."""
    # torch's compiled graphs and the payback rule's ledger are shared through this Redis
    if settings.COSTLAB_COMPILE_CACHE_URL:
        os.environ[CACHE_URL_ENV] = settings.COSTLAB_COMPILE_CACHE_URL


def _record_device(
    run_id: int, run, owner: str, host: str, device: str, gpu_name: str | None, gpu_count: int
) -> DeviceProfile | None:
    """Measure the device, record it and what each auto key became on the run, log those
    choices; the device profile (None when not measured)."""
    world = run.world_size
    label = f"{device} {gpu_name}" if gpu_name else device
    measurement = run_profile(host=host, device=device, queue=run.queue)
    profile = None if measurement is None else DeviceProfile.from_dict(measurement.profile)
    compute_dtype, resolved = _device_keys(run.config_yaml, device, profile)
    db_retry(
        runs.run_device_record,
        what=f"run {run_id}: device record",
        run_id=run.pk,
        owner=owner,
        host=host,
        device=label if world == 1 else f"{label} x{world}",
        gpu_name=gpu_name,
        gpu_count=gpu_count,
        vcpus=_vcpus(run, gpu_count),
        memory_gb=0.0,
        measurement=measurement,
        compute_dtype=compute_dtype,
        resolved=resolved,
        resource_id=resource_id(run.pk),
    )
    for key, choice in resolved.items():
        logger.info(
            "run %s: %s auto → %s: %s", run_id, key, _yaml_value(choice["resolved"]), choice["why"]
        )
    return profile


def _vcpus(run, gpu_count: int) -> int:
    """The vCPUs recorded for the run: none on GPUs, else the threads its ranks (or this
    process) train with."""
    import torch

    from gpu_runtime.distributed import threads_per_rank

    world = run.world_size
    return (
        0
        if gpu_count
        else threads_per_rank(world // run.nnodes) * world
        if world > 1
        else torch.get_num_threads()
    )


@dataclass
class _Attempt:
    """How this node's attempt at the run went: the end to record, what the runtime reported,
    and the run's control (heartbeat) once started."""

    status: str | None  # None: interrupted or lease lost, not ours to end
    error: str = ""
    dataset_sha: str = ""
    result_status: str = ""
    # what the runtime reports of the model trained and the files it saved
    model: dict = field(default_factory=dict)
    gang_timeout: str = ""
    control: RunControl | None = None


def _train(
    run_id: int,
    run,
    attempt: _Attempt,
    *,
    owner: str,
    device: str,
    profile: DeviceProfile | None,
    rendezvous,
    gang: _GangCall | None,
    sink: TelemetrySink,
    stopped: threading.Event,
) -> None:
    """Train the run under a RunControl, noting in ``attempt`` how it ended; the gang's calls
    stopped and every sample stored after."""
    from apps.experiments.models import Run

    try:
        config = gpu_runtime.load_strategy(run.config_yaml)
        attempt.control = control = RunControl(
            run_id=run.pk,
            owner=owner,
            arm_id=run.arm_id,
            revision=run.config_revision,
            config=config,
        )
        result = gpu_runtime.train(
            config,
            sink=sink.put,
            # A SIGTERM between here and training's own handler stops at the first step.
            cancel=lambda: stopped.is_set() or control.should_stop(),
            device=device,
            live=control.live_updates,
            rendezvous=rendezvous,
            profile=profile,
            artifacts_dir=_artifacts_dir(run.pk, config),
        )
        attempt.dataset_sha, attempt.result_status = result.dataset_sha256 or "", result.status
        attempt.model = {
            "params_total": result.params_total,
            "params_trainable": result.params_trainable,
            "artifacts": result.artifacts,
            "resolved": _decided_in_the_run(result.strategies),
        }
        if result.status == "completed":
            attempt.status = Run.Status.SUCCEEDED
        elif result.status == "cancelled" and not control.lease_lost and not stopped.is_set():
            attempt.status = Run.Status.CANCELLED
        else:
            attempt.status = (
                None  # interrupted (worker shutting down) or lease lost: not ours to end
            )
    except Exception as exc:
        if rendezvous is not None and str(exc).startswith("distributed.rendezvous"):
            attempt.gang_timeout, attempt.status = str(exc)[:2000], None
        attempt.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        logger.exception("run %s failed", run_id)
    finally:
        if gang is not None:
            gang.stop()
        # Every measured sample is stored before the run's end is recorded, through an outage
        # too.
        sink.close(timeout_s=settings.COSTLAB_WORKER_DB_RETRY_S)


def _record_end(run_id: int, run, owner: str, attempt: _Attempt) -> None:
    """Record how the run ended: the revisions handed to the trainer, then its gang timeout,
    finish, or release (nothing when the lease was lost)."""
    control = attempt.control
    lease_lost = control is not None and control.lease_lost
    if control is not None:
        control.record_revisions()
    if attempt.gang_timeout:
        db_retry(
            runs.run_gang_timeout,
            what=f"run {run_id}: gang timeout",
            run_id=run.pk,
            owner=owner,
            reason=attempt.gang_timeout,
        )
    elif attempt.status is not None:
        db_retry(
            runs.run_finish,
            what=f"run {run_id}: finish",
            run_id=run.pk,
            owner=owner,
            status=attempt.status,
            error=attempt.error,
            dataset_sha256=attempt.dataset_sha,
            **attempt.model,
        )
    elif not lease_lost:
        _release(run.pk, owner, "worker stopped before the run finished")


# ------------------------------------------------------------------------------
# A run across nodes (distributed.nnodes > 1): a gang of tasks at one c10d rendezvous
# ------------------------------------------------------------------------------
def _host_rendezvous(run, owner: str):
    """Node 0 (the task that claimed the run) serves the rendezvous and records where it is."""
    from gpu_runtime.distributed import Rendezvous, free_port

    host = settings.COSTLAB_RDZV_HOST
    port = settings.COSTLAB_RDZV_PORT or free_port("127.0.0.1" if host == "127.0.0.1" else "")
    endpoint, rdzv_id = f"{host}:{port}", f"costlab-run-{run.pk}-{run.attempts}"
    db_retry(
        runs.run_rendezvous_record,
        what=f"run {run.pk}: rendezvous",
        run_id=run.pk,
        owner=owner,
        endpoint=endpoint,
        rdzv_id=rdzv_id,
        seq_base=run.last_seq + 1,
    )
    return Rendezvous(
        endpoint=endpoint,
        id=rdzv_id,
        is_host=True,
        join_timeout_s=settings.COSTLAB_RDZV_JOIN_TIMEOUT_S,
        local_addr=host,
    )


class _GangCall:
    """While the gang is not complete, call its missing nodes again every few seconds (a wake-up
    that a busy worker prefetched would otherwise wait behind this very run); a surplus one finds
    no seat."""

    EVERY_S = 3.0

    def __init__(self, run):
        self.run_id, self.queue, self.nnodes = run.pk, run.queue, run.nnodes
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"gang-call-{run.pk}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from apps.core.queues import task_send
        from apps.experiments.models import Run

        try:
            while not self._done.wait(self.EVERY_S):
                joined = (
                    Run.objects.filter(pk=self.run_id)
                    .values_list("nodes_joined", flat=True)
                    .first()
                    or 0
                )
                if joined >= self.nnodes:
                    return
                for _ in range(self.nnodes - joined):
                    task_send(runs.RUN_TASK, args=[self.run_id], queue=self.queue)
        except Exception as exc:  # a wake-up is only a nudge: the join timeout decides
            logger.warning("run %s: calling the gang's nodes failed (%s)", self.run_id, exc)
        finally:
            connection.close()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)


def _gang_seat(run_id: int):
    """A seat in the run's gang, waiting (up to the join timeout) for node 0 to record its
    rendezvous."""
    import time

    from apps.experiments.models import Run

    deadline = time.monotonic() + settings.COSTLAB_RDZV_JOIN_TIMEOUT_S
    while True:
        seat = db_retry(runs.run_node_join, what=f"run {run_id}: join", run_id=run_id)
        if seat is not None:
            return seat
        row = Run.objects.filter(pk=run_id).values("status", "nnodes", "rdzv_id").first()
        waiting = (
            row is not None
            and row["nnodes"] > 1
            and row["status"] == Run.Status.RUNNING
            and not row["rdzv_id"]
        )
        if not waiting or time.monotonic() > deadline:
            return None
        time.sleep(0.5)


def _train_as_node(run_id: int, seat) -> None:
    """Train this node's ranks of a run another node owns: no lease, no finish; its telemetry
    goes to the run under the owner's attempt (seqs interleaved by node). Cancel, live keys and
    the end come through the world from node 0; a SIGTERM here stops the whole world at one
    step boundary."""
    from apps.experiments.models import Run
    from gpu_runtime.distributed import Rendezvous

    queue, world = Run.objects.filter(pk=run_id).values_list("queue", "world_size").get()
    device, _, _ = _device_for(queue, world)
    sink = TelemetrySink(
        run_id=run_id,
        attempt=seat.attempt,
        seq_base=seat.seq_base,
        ingest=telemetry_ingest,
        seq_stride=seat.nnodes,
        seq_offset=seat.node,
    )
    logger.info(
        "run %s: joining as node %d of %d at %s", run_id, seat.node, seat.nnodes, seat.endpoint
    )
    result_status = ""
    try:
        config = gpu_runtime.load_strategy(seat.config_yaml)
        result = gpu_runtime.train(
            config,
            sink=sink.put,
            device=device,
            rendezvous=Rendezvous(
                endpoint=seat.endpoint,
                id=seat.rdzv_id,
                is_host=False,
                join_timeout_s=settings.COSTLAB_RDZV_JOIN_TIMEOUT_S,
                local_addr=settings.COSTLAB_RDZV_HOST,
            ),
        )
        result_status = result.status
    except Exception:
        logger.exception(
            "run %s: node %d failed (node 0 records how the run ends)", run_id, seat.node
        )
    finally:
        sink.close(timeout_s=settings.COSTLAB_WORKER_DB_RETRY_S)
    if result_status == "interrupted":
        _sigterm_on()
