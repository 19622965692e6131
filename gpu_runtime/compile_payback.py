"""``kernels.compile: auto``: compile when the saving over the run's remaining steps pays for it.

torch.compile spends seconds once (20-90 s for the small preset on a 2-core CPU; far less when
its graph is already in the cache) and then runs each step ``speedup`` times faster. So

    saving = remaining steps x eager step time x (1 - 1 / speedup)
    cost   = compile time, or the cache's load time where a graph of this shape is cached

and auto compiles when ``saving > MARGIN x cost``. The inputs:

* the compile time, load time and compiled speed-up for this device class and this shape,
  learned from earlier runs (the :class:`CompileLedger`, shared through the Redis the workers
  run, where it is configured) or, where nothing is known yet, the priors below (flagged
  ``estimated``);
* the run's planned steps (``train.steps``) and its eager step time, measured over the run's
  own first steps (the probe: :data:`PROBE_STEPS`, the first one a warm-up), or learned;
* whether a compiled graph of this shape has been saved to a cache this worker reads.

Pure: no torch, no Django. ``gpu_runtime.kernels.compiling`` acts on the decision.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

PROBE_STEPS = 3  # eager steps before auto decides: one warm-up, then two timed
MARGIN = 1.5  # the expected saving must beat the expected cost by half again
# Where this device type has never compiled this shape (estimated; a run that compiles replaces
# them with what it measured). CPU: docs/benchmarks.md's 20-85 s first compile of the small preset
# on 2 cores, compiled steps 1.2-1.3x faster; a cached graph loads in about a tenth of that.
PRIORS = {
    "cpu": {"compile_s": 90.0, "load_s": 9.0, "speedup": 1.2},
    "cuda": {"compile_s": 60.0, "load_s": 6.0, "speedup": 1.3},
}
LEARN_WEIGHT = 0.5  # a new measurement's weight against what was learned before
LEDGER_VERSION = 1
REDIS_LEDGER_KEY = "costlab:compile:ledger:v1"


@dataclass(frozen=True)
class CompileFigures:
    """What compiling this shape costs and buys on this device class."""

    compile_s: float  # a first compile: tracing, code generation, the C++/Triton build
    load_s: float  # the same graph from the cache: tracing and a load
    speedup: float  # eager step time / compiled step time
    eager_step_s: float | None = None  # one optimizer step, eager (learned; None: probe it)
    runs: int = 0  # runs that taught these figures; 0: the priors (estimated)
    caches: tuple[str, ...] = ()  # where a compiled graph of this shape was saved

    @property
    def estimated(self) -> bool:
        return self.runs == 0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["caches"] = list(self.caches)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompileFigures:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["caches"] = tuple(known.get("caches", ()))
        return cls(**known)


def prior(device_type: str) -> CompileFigures:
    """The priors for a device type (a CUDA device's for anything not a CPU)."""
    return CompileFigures(**PRIORS["cpu" if device_type == "cpu" else "cuda"])


@dataclass(frozen=True)
class Decision:
    compile: bool
    why: str
    planned_steps: int
    remaining_steps: int
    eager_step_s: float | None
    cached: bool
    expected_cost_s: float
    expected_saving_s: float
    figures: CompileFigures
    margin: float = MARGIN

    def as_dict(self) -> dict[str, Any]:
        return {
            "compile": self.compile,
            "why": self.why,
            "planned_steps": self.planned_steps,
            "remaining_steps": self.remaining_steps,
            "eager_step_s": _round(self.eager_step_s),
            "cached": self.cached,
            "expected_cost_s": _round(self.expected_cost_s),
            "expected_saving_s": _round(self.expected_saving_s),
            "margin": self.margin,
            "figures": {
                "compile_s": _round(self.figures.compile_s),
                "load_s": _round(self.figures.load_s),
                "speedup": _round(self.figures.speedup, 3),
                "learned_from_runs": self.figures.runs,
                "estimated": self.figures.estimated,
            },
        }


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def decide(
    *,
    planned_steps: int,
    done_steps: int,
    eager_step_s: float,
    figures: CompileFigures,
    cached: bool,
    margin: float = MARGIN,
) -> Decision:
    """Compile iff the expected saving over the remaining steps beats ``margin`` x the cost."""
    remaining = max(0, planned_steps - done_steps)
    cost = figures.load_s if cached else figures.compile_s
    saving = remaining * eager_step_s * max(0.0, 1.0 - 1.0 / figures.speedup)
    on = remaining > 0 and saving > margin * cost
    source = (
        "estimated (priors: nothing learned yet on this device class for this shape)"
        if figures.estimated
        else f"learned from {figures.runs} run{'s' if figures.runs != 1 else ''}"
    )
    what = "loading the cached graph" if cached else "a first compile"
    verb = "pays" if on else "does not pay"
    why = (
        f"compiling {verb}: {remaining} remaining steps x {eager_step_s:.3g} s x "
        f"(1 - 1/{figures.speedup:.2f}) = {saving:.0f} s saved, against {cost:.0f} s for {what}"
        f" x {margin:g} margin; compile figures {source}"
    )
    return Decision(
        compile=on,
        why=why,
        planned_steps=planned_steps,
        remaining_steps=remaining,
        eager_step_s=eager_step_s,
        cached=cached,
        expected_cost_s=cost,
        expected_saving_s=saving,
        figures=figures,
        margin=margin,
    )


def shape_key(device_class: str, torch_version: str, shape: Mapping[str, Any]) -> str:
    """The ledger's key: the device class, the torch version and what shapes the graph (the
    model, its sequence length, dtypes, kernels, memory strategies, micro-batch policy)."""
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()
    return f"{device_class}|torch {torch_version}|{digest[:16]}"


def learned(
    before: CompileFigures | None,
    *,
    device_type: str,
    eager_step_s: float | None = None,
    compile_s: float | None = None,
    load_s: float | None = None,
    speedup: float | None = None,
    cache: str | None = None,
) -> CompileFigures:
    """The figures after a run measured some of them: each measured one moves the learned one
    halfway (the priors are replaced outright), the rest are kept."""
    base = before or prior(device_type)

    def blend(old: float | None, new: float | None) -> float | None:
        if new is None:
            return old
        if old is None or base.estimated:
            return new
        return (1 - LEARN_WEIGHT) * old + LEARN_WEIGHT * new

    measured_compile = compile_s is not None or load_s is not None or speedup is not None
    caches = base.caches if cache is None or cache in base.caches else (*base.caches, cache)
    out = replace(
        base,
        compile_s=blend(base.compile_s, compile_s),
        load_s=blend(base.load_s, load_s),
        speedup=blend(base.speedup, speedup),
        eager_step_s=blend(base.eager_step_s, eager_step_s),
        runs=base.runs + (1 if measured_compile else 0),
        caches=caches,
    )
    return out


@dataclass
class CompileLedger:
    """Learned compile figures by :func:`shape_key`: one JSON file on this host, or one Redis hash
    every worker reads (``redis_url``). Unreadable or down: nothing learned, never an error."""

    path: Path | None = None
    redis_url: str | None = None
    errors: list[str] = field(default_factory=list)

    @classmethod
    def default(cls, redis_url: str | None = None) -> CompileLedger:
        return cls(path=local_cache_dir() / "compile_ledger.json", redis_url=redis_url)

    def _client(self):
        import redis  # the workers' own client; only a ledger in Redis needs it

        return redis.Redis.from_url(self.redis_url, socket_timeout=1, socket_connect_timeout=1)

    def get(self, key: str) -> CompileFigures | None:
        try:
            if self.redis_url:
                raw = self._client().hget(REDIS_LEDGER_KEY, key)
                return None if raw is None else CompileFigures.from_dict(json.loads(raw))
            entry = self._read_file().get(key)
            return None if entry is None else CompileFigures.from_dict(entry)
        except Exception as exc:  # a cache: never a reason to fail a run
            self.errors.append(f"ledger unreadable: {type(exc).__name__}: {exc}")
            return None

    def put(self, key: str, figures: CompileFigures) -> None:
        try:
            if self.redis_url:
                self._client().hset(REDIS_LEDGER_KEY, key, json.dumps(figures.as_dict()))
                return
            entries = self._read_file()
            entries[key] = figures.as_dict()
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"version": LEDGER_VERSION, "entries": entries}))
            tmp.replace(self.path)
        except Exception as exc:
            self.errors.append(f"ledger not written: {type(exc).__name__}: {exc}")

    def _read_file(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        data = json.loads(self.path.read_text())
        return data.get("entries", {}) if data.get("version") == LEDGER_VERSION else {}


def local_cache_dir() -> Path:
    """Where this host keeps compiled graphs and the local ledger: COSTLAB_COMPILE_CACHE_DIR, else
    the user's cache directory."""
    configured = os.environ.get("COSTLAB_COMPILE_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "costlab" / "compile"


__all__ = [
    "MARGIN",
    "PROBE_STEPS",
    "CompileFigures",
    "CompileLedger",
    "Decision",
    "decide",
    "learned",
    "local_cache_dir",
    "prior",
    "shape_key",
]
