"""Inside a DDP world: one ``World`` per rank process, the rendezvous a run across nodes meets
at, and the small helpers the launcher (``gpu_runtime.distributed``) and the rank entry point
(``gpu_runtime.rank``) share.

Rank 0 reads the control file at every step boundary and one all-reduce (MAX) of a three-int
tensor carries its flags and any rank's own SIGTERM to all, so every rank stops, cancels or takes
a live update at the same step. Live keys travel as one ``broadcast_object_list`` from rank 0,
only when they changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpu_runtime.live import live_poller
from gpu_runtime.schema import StrategyConfig

SPEC, CONTROL = "spec.json", "control.json"


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

    def total(self, value: torch.Tensor) -> torch.Tensor:
        """The world's sum of a per-rank tensor (a held-out evaluation's loss sum and count)."""
        out = value.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

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
