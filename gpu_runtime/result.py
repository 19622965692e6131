"""What a run hands back: a RunResult, and the metrics JSONL its samples are written to."""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RunStatus = Literal["completed", "cancelled", "interrupted"]


@dataclass
class RunResult:
    steps: int  # optimizer steps completed (including those before a resume)
    tokens: int  # tokens trained on, cumulative
    wall_s: float  # seconds this call took, setup included
    # device-seconds held: wall_s x devices used (one per call), what an hourly price applies to
    device_s: float
    energy_j: float | None  # joules over this call, measured or modelled (see energy_estimated)
    energy_estimated: bool
    peak_mem_mb: float | None  # MiB: CUDA max allocated, or the process's peak RSS seen on CPU
    final_loss: float | None
    dataset_sha256: str
    config_sha256: str
    device: str
    status: RunStatus
    samples: int  # telemetry samples emitted (the sink saw each)
    # dynamic batching's decisions: {step, kind (grow, shrink, memory_cap, oom, bounds), old/new
    # micro-batch, detail}
    micro_batch_events: list[dict[str, Any]] = field(default_factory=list)
    # what each strategy key did, by key: modules swapped, bytes saved, devices chosen ...
    strategies: dict[str, Any] = field(default_factory=dict)
    # the model actually trained: every parameter, and those the optimizer steps (LoRA: adapters)
    params_total: int | None = None
    params_trainable: int | None = None
    # what the run saved under its artifacts directory (finetune.save): each {kind (lora_adapter |
    # weights), path (relative to the directory), bytes, sha256, config_sha256, dataset_sha256}
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    # held-out evaluation (eval:): the last held-out loss; the wall seconds every evaluation took,
    # summed (inside wall_s, so billed, and reported apart); each one's {step, tokens (trained so
    # far), eval_loss, eval_s}
    eval_loss: float | None = None
    eval_s: float = 0.0
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))


def _json_safe(value: Any) -> Any:
    """JSON has no NaN/inf: a diverged loss (or an infinite noise scale) is reported as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


class JsonlSink:
    """A sink that appends each sample as one JSON line, flushed so a killed run keeps its lines."""

    def __init__(self, path: str | os.PathLike[str]):
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def __call__(self, sample: dict[str, Any]) -> None:
        line = json.dumps(sample, allow_nan=False)
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()

    def close(self) -> None:
        self._fh.close()
