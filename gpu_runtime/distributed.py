"""Data-parallel training (DDP) launched by torch.distributed's elastic launcher.

The process that calls ``train()`` stays the run's one owner: it starts the ranks with
``torch.distributed.launcher.api.elastic_launch`` (a c10d rendezvous on a free local port,
no restarts: a dying rank fails the run), runs the launcher on a helper thread, and keeps
the main thread for what only it can do: poll ``cancel`` and ``live``, take SIGTERM, and
forward every rank's telemetry to the run's sink. It talks to the ranks through a work
directory: ``spec.json`` (what to train), ``control.json`` (stop, cancel, live keys, written
atomically), ``samples-<rank>.jsonl`` (each rank's sampler) and ``result-<rank>.json``.

Inside the world (``World``), rank 0 reads the control file at every step boundary and one
all-reduce (MAX) of a three-int tensor carries its flags and any rank's own SIGTERM to all,
so every rank stops, cancels or takes a live update at the same step. Live keys travel as
one ``broadcast_object_list`` from rank 0, only when they changed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpu_runtime.errors import StrategyError
from gpu_runtime.live import live_poller
from gpu_runtime.result import RunResult
from gpu_runtime.schema import StrategyConfig, config_sha256, strategy_from_dict

log = logging.getLogger(__name__)

SPEC, CONTROL = "spec.json", "control.json"
POLL_S = 0.05  # the owner's loop: cancel, live, SIGTERM and telemetry forwarding
SHUTDOWN_S = 5  # a rank that ignores SIGTERM this long after a peer died is killed


class DistributedError(RuntimeError):
    """A distributed run failed: names the rank and the reason (or the rendezvous that did not
    form)."""


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically (write, then rename): a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def backend_for(config: StrategyConfig, device_type: str) -> str:
    backend = config.distributed.backend
    if backend == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    return backend


def threads_per_rank(nproc: int) -> int:
    """Intra-op threads each local rank gets on CPU: this process's share, at least one."""
    return max(1, torch.get_num_threads() // nproc)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------
# Inside the world: one per rank process
# ------------------------------------------------------------------------------
class World:
    """This rank's place in the world and the few collectives training needs besides DDP's own."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        control: Path | None,
        device: torch.device | None = None,
    ):
        self.rank, self.world_size, self.control = rank, world_size, control
        self.cancelled = False
        self.live_version = 0
        self.live_config: StrategyConfig | None = (
            None  # the config after the last live update taken
        )
        # On the rank's device: nccl reduces CUDA tensors only (gloo, CPU ones)
        self._flags = torch.zeros(3, dtype=torch.int64, device=device or torch.device("cpu"))

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a global batch (the same rows a single process trains
        on)."""
        share = rows.shape[0] // self.world_size
        return rows[self.rank * share : (self.rank + 1) * share]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The world's mean of a per-rank scalar (the step's loss), on this rank's device."""
        out = value.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / self.world_size

    def broadcast_int(self, value: int, device: torch.device) -> int:
        """Rank 0's integer, on every rank (the BatchScaler's next micro-batch)."""
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.broadcast(t, src=0)
        return int(t.item())

    def boundary(
        self,
        *,
        stop: threading.Event,
        current: Callable[[], StrategyConfig],
        apply: Callable[[StrategyConfig], None],
    ) -> Callable[[], None]:
        """The step-boundary agreement (the trainer's ``agree`` hook): stop, cancel and live keys,
        world-wide.

        Each node's local rank 0 reads its node's control file (``control``; None on other
        ranks)."""

        def agree() -> None:
            control = (read_json(self.control) or {}) if self.control is not None else {}
            flags = self._flags
            flags.copy_(
                torch.tensor(
                    [
                        int(stop.is_set() or bool(control.get("stop"))),
                        int(bool(control.get("cancel"))),
                        int(control.get("live_version", 0)),
                    ],
                    dtype=torch.int64,
                )
            )
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            stopping, cancel, version = (int(v) for v in flags.tolist())
            if stopping:
                stop.set()
            if cancel:
                self.cancelled = True
            if version > self.live_version:
                # The owner's node holds the live keys; in a run across nodes it need not host rank
                # 0.
                mine = (int(control.get("live_version", 0)), control.get("live"))
                gathered: list[Any] = [None] * self.world_size
                dist.all_gather_object(gathered, mine)
                live = max(gathered, key=lambda item: item[0])[1]
                self.live_version = version
                live_poller(lambda: live, current=current, apply=self._recording(apply))()

        return agree

    def _recording(
        self, apply: Callable[[StrategyConfig], None]
    ) -> Callable[[StrategyConfig], None]:
        def take(updated: StrategyConfig) -> None:
            apply(updated)
            self.live_config = updated

        return take


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of a run across nodes meet (c10d): every node passes the same endpoint and
    id.

    ``is_host``: this node serves the rendezvous store on the endpoint's port. ``join_timeout_s``:
    how long the nodes wait for each other before all give up. ``local_addr``: this node's address
    as the others reach it.
    """

    endpoint: str
    id: str
    is_host: bool
    join_timeout_s: float = 60.0
    local_addr: str | None = None


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


def _failure_message(exc: BaseException) -> str:
    """A ChildFailedError as one sentence naming the rank that failed first and why."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(exc, ChildFailedError):
        rank, failure = exc.get_first_failure()
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


def _rank_command() -> tuple[str, tuple[str, ...]]:
    """The rank's command line: this interpreter, with this copy of gpu_runtime first on the
    path."""
    root = str(Path(__file__).resolve().parent.parent)
    bootstrap = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "runpy.run_module('gpu_runtime.rank', run_name='__main__')"
    )
    return sys.executable, ("-c", bootstrap, root)


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
            "resume_from": resume_from,
            "owner_pid": os.getpid(),
        },
    )
    control = _Control(workdir / CONTROL)
    forwarder = _Forwarder(workdir, nproc, sink)
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
        local_addr=rendezvous.local_addr,
        shutdown_timeout=SHUTDOWN_S,
    )
    launch = _Launch()
    entry, args = _rank_command()

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
    )


# ------------------------------------------------------------------------------
# A rank's process
# ------------------------------------------------------------------------------
def _exit_with_owner(owner_pid: int) -> None:
    """A rank whose owner died (killed outright, no time to close the launcher) ends too: no
    orphans."""

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != owner_pid:
                os._exit(70)

    threading.Thread(target=watch, name="gpu_runtime-owner-watch", daemon=True).start()


@contextlib.contextmanager
def process_group(backend: str, device: torch.device) -> Iterator[None]:
    from datetime import timedelta

    kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=120)}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    try:
        yield
    finally:
        dist.destroy_process_group()


def rank_main(workdir: str) -> None:
    """Entry point of one rank (``python -m gpu_runtime.rank WORKDIR``), started by the elastic
    agent."""
    from gpu_runtime.result import JsonlSink
    from gpu_runtime.runtime import train_local

    root = Path(workdir)
    spec = json.loads((root / SPEC).read_text())
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    _exit_with_owner(int(spec["owner_pid"]))
    torch.set_num_threads(int(spec["threads"]))
    if spec["device_type"] == "cuda":
        device = torch.device("cuda", spec["devices"][local_rank])
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    config = strategy_from_dict(spec["config"])
    world = World(
        rank=rank,
        world_size=world_size,
        control=root / CONTROL if local_rank == 0 else None,
        device=device,
    )
    sink = JsonlSink(root / f"samples-{local_rank}.jsonl")
    try:
        with process_group(spec["backend"], device):
            result = train_local(
                config,
                sink=sink,
                device=str(device),
                world=world,
                checkpoint_dir=spec["checkpoint_dir"] if rank == 0 else None,
                resume_from=spec["resume_from"],
            )
    finally:
        sink.close()
    live_sha = None if world.live_config is None else config_sha256(world.live_config)
    write_json(
        root / f"result-{local_rank}.json",
        {
            **result.to_dict(),
            "rank": rank,
            "live_applied": world.live_version,
            "live_config_sha256": live_sha,
        },
    )
