"""Data-parallel training (DDP) launched by torch.distributed's elastic launcher.

The process that calls ``train()`` stays the run's one owner: it starts the ranks with
``torch.distributed.launcher.api.elastic_launch`` (a c10d rendezvous on a free local port,
no restarts: a dying rank fails the run), runs the launcher on a helper thread, and keeps
the main thread for what only it can do: poll ``cancel`` and ``live``, take SIGTERM, and
forward every rank's telemetry to the run's sink. It talks to the ranks through a work
directory: ``spec.json`` (what to train), ``control.json`` (stop, cancel, live keys, written
atomically), ``samples-<rank>.jsonl`` (each rank's sampler) and ``result-<rank>.json``.

Inside the world: ``gpu_runtime.world`` (``World``, ``Rendezvous``); a rank's process:
``gpu_runtime.rank``, forked from a forkserver that imported what training imports once, or
a new interpreter in a daemonic process (``_rank_entry``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu_runtime.errors import StrategyError
from gpu_runtime.result import RunResult
from gpu_runtime.schema import StrategyConfig
from gpu_runtime.world import (
    CONTROL,
    SPEC,
    DistributedError,
    Rendezvous,
    World,
    backend_for,
    free_port,
    read_json,
    threads_per_rank,
    write_json,
)

log = logging.getLogger(__name__)

POLL_S = 0.05  # the owner's loop: cancel, live, SIGTERM and telemetry forwarding
SHUTDOWN_S = 5  # a rank that ignores SIGTERM this long after a peer died is killed


__all__ = [
    "DistributedError",
    "Rendezvous",
    "World",
    "backend_for",
    "ddp_devices",
    "free_port",
    "threads_per_rank",
    "train_distributed",
]


# ------------------------------------------------------------------------------
# The owner: launch, steer, forward telemetry, gather
# ------------------------------------------------------------------------------
class _Control:
    """What the owner tells rank 0; rewritten whole on every change."""

    def __init__(self, path: Path):
        self.path = path
        self.state: dict[str, Any] = {"stop": False, "cancel": False, "live_version": 0, "live": {}}
        write_json(path, self.state)

    def set(self, **changes: Any) -> None:
        if any(self.state.get(k) != v for k, v in changes.items()):
            self.state.update(changes)
            write_json(self.path, self.state)

    def add_live(self, changes: dict[str, Any]) -> None:
        merged = json.loads(json.dumps(self.state["live"]))
        _deep_update(merged, changes)
        self.set(live=merged, live_version=self.state["live_version"] + 1)


def _deep_update(into: dict[str, Any], changes: dict[str, Any]) -> None:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_update(into[key], value)
        else:
            into[key] = value


class _Forwarder:
    """Tails each rank's samples file and hands every complete line to the run's sink, in one seq
    order."""

    def __init__(
        self, workdir: Path, local_ranks: int, sink: Callable[[dict[str, Any]], None] | None
    ):
        self.paths = [workdir / f"samples-{r}.jsonl" for r in range(local_ranks)]
        self.offsets = [0] * local_ranks
        self.sink, self.seq, self.errors = sink, 0, 0

    def pump(self) -> None:
        for i, path in enumerate(self.paths):
            try:
                with path.open("rb") as fh:
                    fh.seek(self.offsets[i])
                    data = fh.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next pump
            self.offsets[i] += end
            for line in data[:end].splitlines():
                sample = json.loads(line)
                sample["seq"] = (
                    self.seq
                )  # one seq space for the run; the rank says whose sample it is
                self.seq += 1
                if self.sink is not None:
                    try:
                        self.sink(sample)
                    except (
                        Exception
                    ):  # as the single-process sampler: a failing sink must not kill the run
                        self.errors += 1
                        log.exception("telemetry sink failed on sample seq=%d", sample["seq"])


def _root_failure(exc) -> tuple[int, Any]:
    """The rank whose failure explains the others. A rank killed by a signal the launcher does not
    send (SIGKILL from outside, a segfault, the OOM killer) comes first: its peers then raise
    "Connection closed by peer" and may be recorded earlier than the death itself. Otherwise the
    first failure in time."""
    killed = [
        (failure.timestamp, rank, failure)
        for rank, failure in exc.failures.items()
        if failure.exitcode is not None
        and failure.exitcode < 0
        and failure.exitcode != -signal.SIGTERM
    ]
    if killed:
        _, rank, failure = min(killed, key=lambda k: (k[0], k[1]))
        return rank, failure
    return exc.get_first_failure()


def _failure_message(exc: BaseException) -> str:
    """A ChildFailedError as one sentence naming the rank that failed first and why."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(exc, ChildFailedError):
        rank, failure = _root_failure(exc)
        message = failure.message
        if isinstance(message, dict):
            message = message.get("message", json.dumps(message))
        reason = str(message or f"exit code {failure.exitcode}").strip().splitlines()
        others = sorted(set(exc.failures) - {rank})
        also = (
            f" (then rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} stopped)"
            if others
            else ""
        )
        return (
            f"distributed: rank {rank} (pid {failure.pid}) failed with exit code "
            f"{failure.exitcode}: {reason[-1] if reason else 'no message'}{also}"
        )
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    if isinstance(exc, RendezvousTimeoutError):
        return f"distributed.rendezvous: not every node joined in time: {exc}"
    return f"distributed: the launch failed: {type(exc).__name__}: {exc}"


@dataclass
class _Launch:
    results: dict[int, Any] = field(default_factory=dict)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


# What a rank's process imports before it trains: imported once, by the launch's forkserver (see
# _rank_entry), not by every rank. torch._dynamo is what torch's optimizers import on their first
# use (torch._disable_dynamo), about as much CPU as torch itself.
RANK_PRELOAD = ("gpu_runtime.rank", "gpu_runtime.runtime", "torch._dynamo")


def _rank_entry() -> tuple[Callable[..., None] | str, tuple[str, ...], str]:
    """How the elastic agent starts the ranks: (entry point, its arguments before the work
    directory, start method).

    gpu_runtime.rank.rank_main, in processes forked from multiprocessing's forkserver: a server,
    started by the first launch in this process and kept for the next ones, imports
    RANK_PRELOAD once, and each rank is forked from it. A rank that starts a new interpreter
    spends about 1.8 CPU-s importing before it trains (AMD EPYC, 2 cores). The server exits with
    this process; a rank takes the agent's variables (RANK, MASTER_ADDR, ...) as it starts, and
    otherwise the environment the server started with.

    A daemonic process (a Celery prefork pool's child) may not start multiprocessing children:
    there each rank is a new interpreter, ``python -c ... gpu_runtime.rank WORKDIR``, with this
    copy of gpu_runtime first on its path."""
    import multiprocessing

    if multiprocessing.current_process().daemon:
        root = str(Path(__file__).resolve().parent.parent)
        bootstrap = (
            "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
            "runpy.run_module('gpu_runtime.rank', run_name='__main__')"
        )
        return sys.executable, ("-c", bootstrap, root), "spawn"
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(RANK_PRELOAD))
    from gpu_runtime.rank import rank_main

    return rank_main, (), "forkserver"


def ddp_devices(
    config: StrategyConfig, requested: str | None
) -> tuple[str, list[int], dict[str, Any]]:
    """The device type the ranks train on and, on CUDA, their device indices in placement's
    order."""
    from gpu_runtime.placement import choose_device

    nproc = config.distributed.nproc_per_node
    if requested == "cpu" or (requested is None and not torch.cuda.is_available()):
        return (
            "cpu",
            [],
            {"strategy": config.placement.strategy, "gpus": nproc, "devices": [], "how": "cpu"},
        )
    if not torch.cuda.is_available():
        raise StrategyError.single(
            "device", f"{requested!r} asked for, but this host has no CUDA device"
        )
    chosen, report = choose_device(strategy=config.placement.strategy, gpus=nproc, requested=None)
    devices = list(report.get("devices") or [])
    if len(devices) < nproc:  # topology unreadable: CUDA's order, from the first
        devices = list(range(nproc))
        report["devices"] = devices
    return "cuda", devices, report


def train_distributed(
    config: StrategyConfig,
    *,
    sink: Callable[[dict[str, Any]], None] | None,
    cancel: Callable[[], bool] | None,
    live: Callable[[], dict[str, Any] | None] | None,
    device: str | None,
    checkpoint_dir: str | None,
    resume_from: str | None,
    stop: threading.Event,
    artifacts_dir: str | None = None,
    threads: int | None = None,
    rendezvous: Rendezvous | None = None,
) -> RunResult:
    """Train on ``nproc_per_node`` local ranks; return what the world measured (see the module
    docstring).

    Without ``rendezvous`` this node is the whole world and hosts the rendezvous on a free local
    port; with one, it is one of ``nnodes`` nodes meeting there (its result covers its own ranks).
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    wall_start = time.perf_counter()
    dist_cfg = config.distributed
    world_size = dist_cfg.world_size
    device_type, devices, placement = ddp_devices(config, device)
    backend = backend_for(config, device_type)
    threads = threads or threads_per_rank(dist_cfg.nproc_per_node)
    workdir = Path(tempfile.mkdtemp(prefix="costlab-ddp-"))
    if rendezvous is None:
        rendezvous = Rendezvous(
            endpoint=f"127.0.0.1:{free_port()}",
            id=f"costlab-{uuid.uuid4().hex[:12]}",
            is_host=True,
            join_timeout_s=120,
            local_addr="127.0.0.1",
        )
    endpoint, run_id = rendezvous.endpoint, rendezvous.id
    nproc = dist_cfg.nproc_per_node
    write_json(
        workdir / SPEC,
        {
            "config": config.model_dump(mode="json"),
            "device_type": device_type,
            "devices": devices,
            "backend": backend,
            "threads": threads,
            "checkpoint_dir": checkpoint_dir,
            "artifacts_dir": artifacts_dir,
            "resume_from": resume_from,
            "owner_pid": os.getpid(),
        },
    )
    control = _Control(workdir / CONTROL)
    forwarder = _Forwarder(workdir, nproc, sink)
    entry, args, start_method = _rank_entry()
    launch_config = LaunchConfig(
        min_nodes=dist_cfg.nnodes,
        max_nodes=dist_cfg.nnodes,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        rdzv_configs={
            "join_timeout": int(rendezvous.join_timeout_s),
            "timeout": int(rendezvous.join_timeout_s),
            "is_host": rendezvous.is_host,
        },
        max_restarts=0,
        monitor_interval=0.1,
        start_method=start_method,
        local_addr=rendezvous.local_addr,
        shutdown_timeout=SHUTDOWN_S,
    )
    launch = _Launch()

    def run_launcher() -> None:
        try:
            launch.results = elastic_launch(launch_config, entry)(*args, str(workdir))
        except BaseException as exc:  # noqa: BLE001 - handed to the owner thread, which raises it
            launch.error = exc
        finally:
            launch.done.set()

    # The launcher runs on a helper thread, so it installs no signal handlers: SIGTERM stays the
    # owner's, and becomes a stop every rank takes at the same step boundary.
    thread = threading.Thread(target=run_launcher, name="gpu_runtime-elastic-launch", daemon=True)
    try:
        thread.start()
        while not launch.done.wait(POLL_S):
            _steer(control, stop=stop, cancel=cancel, live=live)
            forwarder.pump()
        thread.join()
        forwarder.pump()
        if launch.error is not None:
            raise DistributedError(_failure_message(launch.error)) from None
        ranks = [read_json(workdir / f"result-{r}.json") for r in range(nproc)]
        missing = [r for r, res in enumerate(ranks) if res is None]
        if missing:
            raise DistributedError(f"distributed: local rank {missing[0]} ended without a result")
        return _gather(
            ranks,
            wall_s=time.perf_counter() - wall_start,
            samples=forwarder.seq,
            extra={
                "world_size": world_size,
                "nproc_per_node": dist_cfg.nproc_per_node,
                "nnodes": dist_cfg.nnodes,
                "backend": backend,
                "launcher": "torch.distributed.launcher.api.elastic_launch",
                "rendezvous": {"backend": "c10d", "endpoint": endpoint, "id": run_id},
                "threads_per_rank": threads if device_type == "cpu" else None,
                "placement": placement,
            },
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _steer(
    control: _Control,
    *,
    stop: threading.Event,
    cancel: Callable[[], bool] | None,
    live: Callable[[], dict[str, Any] | None] | None,
) -> None:
    if stop.is_set():
        control.set(stop=True)
    if cancel is not None and not control.state["cancel"] and cancel():
        control.set(cancel=True)
    if live is not None:
        changes = live()
        if changes:
            control.add_live(changes)


def _gather(
    ranks: list[dict[str, Any]], *, wall_s: float, samples: int, extra: dict[str, Any]
) -> RunResult:
    """One RunResult for the world: rank 0's training figures, every device's time and energy."""
    lead = ranks[0]
    energies = [r["energy_j"] for r in ranks]
    mems = [r["peak_mem_mb"] for r in ranks if r["peak_mem_mb"] is not None]
    labels = [r["device"] for r in ranks]
    device = f"{labels[0]} x{len(labels)}" if len(set(labels)) == 1 else ", ".join(labels)
    strategies = dict(lead["strategies"])
    strategies.pop("placement", None)
    strategies["placement"] = extra.pop("placement")
    strategies["distributed"] = {
        **extra,
        "ranks": [
            {
                "rank": r["rank"],
                "device": r["device"],
                "steps": r["steps"],
                "status": r["status"],
                "final_loss": r["final_loss"],
                "eval_loss": r.get("eval_loss"),
                "config_sha256": r["config_sha256"],
                "energy_j": r["energy_j"],
                "samples": r["samples"],
                "live_applied": r["live_applied"],
                "live_config_sha256": r["live_config_sha256"],
                "scaler_events": len(r["micro_batch_events"]),
            }
            for r in ranks
        ],
    }
    return RunResult(
        steps=lead["steps"],
        tokens=lead["tokens"],
        wall_s=wall_s,
        device_s=wall_s * len(ranks),
        energy_j=None if any(e is None for e in energies) else sum(energies),
        energy_estimated=any(r["energy_estimated"] for r in ranks),
        peak_mem_mb=max(mems) if mems else None,
        final_loss=lead["final_loss"],
        dataset_sha256=lead["dataset_sha256"],
        config_sha256=lead["config_sha256"],
        device=device,
        status=lead["status"],
        samples=samples,
        micro_batch_events=lead["micro_batch_events"],
        strategies=strategies,
        params_total=lead.get("params_total"),
        params_trainable=lead.get("params_trainable"),
        artifacts=lead.get("artifacts") or [],
        eval_loss=lead.get("eval_loss"),
        eval_s=lead.get("eval_s") or 0.0,
        evaluations=lead.get("evaluations") or [],
    )
