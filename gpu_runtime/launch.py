"""``train()``: the one entry point the platform calls (from a Celery task) and the CLI wraps:
one process (``gpu_runtime.runtime.train_local``), or a DDP world (``gpu_runtime.distributed``),
whose ranks each train locally. Apart from runtime, so that neither the rank's process nor the
launcher that starts it imports back the module that dispatches to them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gpu_runtime.capability import resolve_device
from gpu_runtime.device_keys import resolve_device_keys
from gpu_runtime.distributed import train_distributed
from gpu_runtime.errors import StrategyError
from gpu_runtime.result import RunResult
from gpu_runtime.runtime import (
    refuse_what_the_host_cannot_run,
    stop_on_sigterm,
    train_local,
    with_steps,
)
from gpu_runtime.schema import StrategyConfig
from gpu_runtime.world import Rendezvous


def train(
    config: StrategyConfig,
    *,
    sink: Callable[[dict[str, Any]], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    device: str | None = None,
    steps: int | None = None,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    live: Callable[[], dict[str, Any] | None] | None = None,
    rendezvous: Rendezvous | None = None,
    profile=None,
    artifacts_dir: str | None = None,
) -> RunResult:
    """Train with a strategy, streaming telemetry samples to ``sink``; return what was measured.

    ``steps`` overrides ``train.steps`` (also the LR schedule's length). ``cancel`` is
    polled before every step, and so is ``live``, which may return a nested dict of
    live keys (``gpu_runtime.live.LIVE_KEYS``) to apply from that step on. SIGTERM (in
    the main thread) stops after the current step. Every ending writes a checkpoint to
    ``checkpoint_dir`` when one is given. ``device`` None (or a bare ``cuda``) lets
    ``placement.strategy`` pick the GPU(s).

    With ``distributed.nproc_per_node`` above 1 the ranks train in their own processes,
    launched by torch's elastic launcher (``gpu_runtime.distributed``); this call owns them,
    forwards their samples (each with its ``rank``) and returns the world's result. A run
    across ``distributed.nnodes`` nodes needs the ``rendezvous`` every node meets at; each
    node's call returns its own ranks' result.

    ``artifacts_dir``: where `finetune.save` writes the trained adapter or weights (safetensors);
    without one nothing is saved.

    ``precision.compute_dtype: auto`` and ``kernels.compile: auto`` resolve from ``profile`` (a
    gpu_runtime.profile.DeviceProfile of the device), or from one measured now when none is
    given (gpu_runtime.device_keys); each decision is reported under its key in ``strategies``.
    """
    config = with_steps(config, steps)
    if config.distributed.world_size == 1:
        return train_local(
            config,
            sink=sink,
            cancel=cancel,
            device=device,
            checkpoint_dir=checkpoint_dir,
            resume_from=resume_from,
            live=live,
            profile=profile,
            artifacts_dir=artifacts_dir,
        )
    dev = resolve_device(
        device if device not in (None, "cuda") else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    config, auto = resolve_device_keys(config, dev, profile)
    refuse_what_the_host_cannot_run(config, dev)
    if config.distributed.nnodes > 1 and rendezvous is None:
        raise StrategyError.single(
            "distributed.nnodes",
            (
                f"a run across {config.distributed.nnodes} nodes needs the rendezvous its "
                "nodes meet at (gpu_runtime.distributed.Rendezvous); none was given"
            ),
        )
    with stop_on_sigterm() as stop:
        result = train_distributed(
            config,
            sink=sink,
            cancel=cancel,
            live=live,
            device=dev.type,
            checkpoint_dir=checkpoint_dir,
            resume_from=resume_from,
            stop=stop,
            rendezvous=rendezvous,
            artifacts_dir=artifacts_dir,
        )
    result.strategies.update(auto)
    return result
