"""torch.compile in a run: torch's own caches, the payback rule acted on at a step boundary, and
what the run reports (``strategies["kernels.compile"]``).

Caches. torch's inductor FX-graph cache and AOT-autograd cache are turned on, on this host and,
where a Redis URL is configured (``COSTLAB_COMPILE_CACHE_URL``; the workers set it to their own
broker's), in that Redis too, keyed as torch keys them: the second run of a shape on any worker
of the same device class loads its graphs instead of compiling them. Redis down or unreadable:
the run compiles against the local cache, says so, and never fails for it.

The controller (:class:`CompileControl`). ``kernels.compile: true`` compiles from the first
step; ``auto`` trains eager through the probe (gpu_runtime.compile_payback.PROBE_STEPS), then
decides with the payback rule, or decides at the start where this shape's eager step time is
already learned (always so for a DDP run, whose ranks must agree before DDP wraps the model).
After the compile it times the compiled steps. It falls back to eager at the next step boundary
when the compile fails (the step is run again eager), when compiled steps measure no faster than
eager ones, or (auto) when compiling, recompiles included, has cost more than it was expected to
save. Then it goes quiet: nothing of it runs in the training hot path. At the run's end what it
measured goes into the ledger, so the next run decides on measured figures.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable
from typing import Any

import torch

from gpu_runtime.compile_payback import (
    PROBE_STEPS,
    CompileFigures,
    CompileLedger,
    Decision,
    decide,
    learned,
    prior,
    shape_key,
)

CACHE_URL_ENV = "COSTLAB_COMPILE_CACHE_URL"
MEASURE_STEPS = 2  # compiled steps timed after the compile before the speed-up is judged


def configure_caches(url: str | None = None) -> dict[str, Any]:
    """Turn torch's compile caches on: local always, Redis where ``url`` (or the environment's
    COSTLAB_COMPILE_CACHE_URL) answers a ping. Returns what is in use and why."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    url = url if url is not None else os.environ.get(CACHE_URL_ENV) or None
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    # the fused RMSNorm+QKV and int8 kernels are autograd.Functions; without this every graph
    # holding one bypasses the AOT-autograd cache and is traced again on every run
    functorch_config.autograd_cache_allow_custom_autograd_functions = True
    if "TORCHINDUCTOR_VEC_ISA_OK" not in os.environ:
        # Without this every process test-builds a C++ program per vector ISA before it loads a
        # cached graph: 1.5 of a 4.7-s load on a 2-core Xeon. Set in every run alike (the value is
        # part of torch's cache key); a compiler that cannot build the ISA fails the compile, and
        # the run falls back to eager with the reason.
        with contextlib.suppress(AttributeError):  # a torch without the switch: it checks
            inductor_config.cpp.vec_isa_ok = True
    report: dict[str, Any] = {"local": True, "remote": None}
    if not url:
        report["why"] = "no Redis configured: compiled graphs are cached on this host only"
        return report
    try:
        import redis

        redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping()
    except Exception as exc:  # down, refused, no client: compile locally
        inductor_config.fx_graph_remote_cache = False
        functorch_config.enable_remote_autograd_cache = False
        report["why"] = (
            f"Redis unreachable ({type(exc).__name__}): compiled graphs are cached on this "
            "host only"
        )
        report["remote_error"] = str(exc)[:200]
        return report
    os.environ["TORCHINDUCTOR_REDIS_URL"] = url
    inductor_config.fx_graph_remote_cache = True
    functorch_config.enable_remote_autograd_cache = True
    report["remote"] = "redis"
    report["why"] = "compiled graphs are shared through Redis with every worker"
    return report


def cache_name(cache: dict[str, Any]) -> str:
    """Where this run's compiled graphs are saved, as the ledger records it."""
    if cache.get("remote") == "redis":
        return "redis"
    import socket

    return f"local:{socket.gethostname()}"


def graph_shape(config) -> dict[str, Any]:
    """What decides the compiled graph (the ledger's key beside the device class)."""
    dyn = config.optimizer.dynamic_batching
    kernels = config.kernels.model_dump(mode="json")
    kernels.pop("compile", None)
    return {
        "model": config.model.model_dump(mode="json"),
        "precision": config.precision.model_dump(mode="json"),
        "kernels": kernels,
        "memory": config.memory.model_dump(mode="json"),
        "offload": config.offload.model_dump(mode="json"),
        "finetune": config.finetune.model_dump(mode="json"),
        "global_batch": config.train.global_batch,
        "micro_batch": "dynamic" if dyn.enabled else config.train.micro_batch,
    }


# torch's own clocks of a compile (torch._dynamo.utils.compilation_time_metrics): dynamo's
# frame (tracing, AOT autograd, inductor's forward, or their cache loads) and the backward
# inductor compiles lazily at the first backward.
COMPILE_CLOCKS = ("_compile.compile_inner", "backward._backward_impl")


def _compile_clock() -> float:
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(sum(compilation_time_metrics.get(key, ())) for key in COMPILE_CLOCKS))


def _counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "fx_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fx_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "aot_hit": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "aot_miss": int(counters["aot_autograd"]["autograd_cache_miss"]),
    }


def is_compile_error(exc: BaseException) -> bool:
    """A failure of torch.compile itself (tracing, lowering, the C++/Triton build)."""
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(exc, TorchDynamoException)


class CompileControl:
    """One run's compile: when to switch the trainer's forward, and what it cost and bought."""

    # Test hook: what compiles the model (None: torch.compile; tests hand in one that fails).
    compile_fn: Callable[[torch.nn.Module], Callable] | None = None

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        requested: bool | str,
        planned_steps: int,
        start_step: int,
        device_type: str,
        device_class: str,
        config,
        ledger: CompileLedger,
        cache: dict[str, Any],
        mark_batch_dynamic: bool,
        distributed: bool,
        lead: bool = True,
    ):
        self.model, self.requested = model, requested
        self.planned_steps, self.start_step = planned_steps, start_step
        self.device_type = device_type
        self.ledger, self.cache = ledger, cache
        self.key = shape_key(device_class, torch.__version__, graph_shape(config))
        self.known = ledger.get(self.key)
        self.figures = self.known or prior(device_type)
        self.cached = cache_name(cache) in self.figures.caches
        self.mark_batch_dynamic = mark_batch_dynamic
        self.distributed, self.lead = distributed, lead
        self.trainer = None  # set by bind(): its ``forward`` is switched
        self.state = "eager"  # eager | probe | compiling | measuring | compiled | fell_back
        self.decision: Decision | None = None
        self.decided_at: int | None = None
        self.why = ""
        self.fallback: str | None = None
        # the step that compiled, less an eager step (measured), else less a compiled one
        self.compile_s: float | None = None
        self.compile_step_s: float | None = None
        self.compile_clocked = False  # compile_s is torch's compile clock (else a step delta)
        self._clock0 = 0.0
        self.recompile_s = 0.0
        self.recompiles = 0
        self.cache_outcome: str | None = None
        self.probe: list[float] = []
        self.compiled: list[float] = []
        self._before: dict[str, int] | None = None
        self._graphs_base: int | None = None  # dynamo's graph count when compiling began
        self._compiled_forward: Callable | None = None
        self.eager_step_s = self.figures.eager_step_s if self.known else None
        self._start()

    # --- at the start --------------------------------------------------------------------------
    def _start(self) -> None:
        if self.requested is True:
            self.why = "kernels.compile: true"
            self.state = "compiling"
            return
        if self.requested is not True and self.requested != "auto":
            self.why = "kernels.compile: false"
            return
        if self.eager_step_s is not None:  # learned: decide now, for the whole run
            self._decide(self.start_step, self.eager_step_s)
        elif self.distributed:
            self.why = (
                "eager: a DDP run decides at its start and no eager step time is learned yet for "
                "this shape on this device class (a single-process run of it teaches one)"
            )
        elif self.planned_steps - self.start_step <= PROBE_STEPS:
            self.why = (
                f"eager: {self.planned_steps - self.start_step} steps, no longer than the "
                f"{PROBE_STEPS}-step probe, cannot repay a compile"
            )
        else:
            self.state = "probe"
            self.why = f"eager through the {PROBE_STEPS}-step probe, then the payback rule decides"

    @property
    def compile_now(self) -> bool:
        """Whether the model is to be compiled before the first step (before DDP wraps it)."""
        return self.state == "compiling"

    def initial_forward(self, eager: Callable) -> Callable:
        """The forward the run starts with: compiled when decided at the start, else ``eager``."""
        self._eager = eager
        if self.state != "compiling":
            return eager
        self._compiled_forward = self._compile()
        self._before = _counts()
        self._graphs_base = self._before["graphs"]
        self._clock0 = _compile_clock()
        return self._compiled_forward

    def _compile(self) -> Callable:
        return (self.compile_fn or torch.compile)(self.model)

    def bind(self, trainer) -> None:
        self.trainer = trainer
        trainer.compiling = self
        trainer.mark_batch_dynamic = self.compile_now and self.mark_batch_dynamic

    @property
    def active(self) -> bool:
        """Whether the trainer must tell it of each step (False: quiet for the rest of the run)."""
        return self.state in ("probe", "compiling", "measuring", "compiled")

    # --- at a step boundary --------------------------------------------------------------------
    def after_step(self, step: int, seconds: float) -> None:
        """Step ``step`` (1-based: steps done) took ``seconds``."""
        done = step - self.start_step
        if self.state == "probe":
            if done > 1:  # the first is warm-up
                self.probe.append(seconds)
            if done >= PROBE_STEPS:
                self.eager_step_s = statistics.median(self.probe)
                self._decide(step, self.eager_step_s)
                if self.state == "compiling":
                    self._switch(compiled=True)
        elif self.state == "compiling":
            after = _counts()
            before = self._before or after
            self.compile_step_s = seconds
            clocked = _compile_clock() - self._clock0
            eager = self.eager_step_s if self.eager_step_s is not None else 0.0
            # torch's own clock where it ran (a real compile), else what the step cost more
            self.compile_clocked = clocked > 0
            self.compile_s = clocked if clocked > 0 else max(0.0, seconds - eager)
            hits = (after["fx_hit"] - before["fx_hit"]) + (after["aot_hit"] - before["aot_hit"])
            misses = (after["fx_miss"] - before["fx_miss"]) + (
                after["aot_miss"] - before["aot_miss"]
            )
            self.cache_outcome = (
                "hit" if hits and not misses else "partial" if hits else "miss" if misses else None
            )
            self._before = after
            self.state = "measuring"
            if self.trainer is not None:  # the graph exists: later micro-batches need no mark
                self.trainer.mark_batch_dynamic = False
            self._over_budget()
        elif self.state in ("measuring", "compiled"):
            after = _counts()
            if self._before is not None and after["graphs"] > self._before["graphs"]:
                typical = statistics.median(self.compiled) if self.compiled else seconds
                self.recompiles += after["graphs"] - self._before["graphs"]
                self.recompile_s += max(0.0, seconds - typical)
                self._before = after
                self._over_budget()
                return
            self._before = after
            if self.state == "measuring":
                self.compiled.append(seconds)
                if self.eager_step_s is None and not self.compile_clocked:  # less a compiled step
                    self.compile_s = max(
                        0.0, self.compile_step_s - statistics.median(self.compiled)
                    )
                if len(self.compiled) >= MEASURE_STEPS:
                    self.state = "compiled"
                    self._judge_speed()

    def failed(self, exc: BaseException) -> None:
        """The compiled forward raised a compile error: eager from this step, with the reason."""
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self._fall_back(f"the compile failed ({type(exc).__name__}: {first_line[:200]})")

    @property
    def compiled_now(self) -> bool:
        return self.state in ("compiling", "measuring", "compiled")

    def _decide(self, step: int, eager_step_s: float) -> None:
        self.decision = decide(
            planned_steps=self.planned_steps,
            done_steps=step,
            eager_step_s=eager_step_s,
            figures=self.figures,
            cached=self.cached,
        )
        self.decided_at = step
        self.why = self.decision.why
        self.state = "compiling" if self.decision.compile else "eager"

    def _switch(self, *, compiled: bool) -> None:
        if compiled:
            self._compiled_forward = self._compiled_forward or self._compile()
            self._before = _counts()
            self._graphs_base = self._before["graphs"]
            self._clock0 = _compile_clock()
        if self.trainer is not None:
            self.trainer.forward = self._compiled_forward if compiled else self._eager
            self.trainer.mark_batch_dynamic = compiled and self.mark_batch_dynamic

    def _fall_back(self, reason: str) -> None:
        self.fallback = reason
        self.state = "fell_back"
        self._switch(compiled=False)

    def _spent(self) -> float:
        return (self.compile_s or 0.0) + self.recompile_s

    def _over_budget(self) -> None:
        """auto: compiling (recompiles included) has cost more than it was expected to save."""
        if self.decision is None or self.requested != "auto" or self.distributed:
            return
        if self._spent() > self.decision.expected_saving_s:
            self._fall_back(
                f"compiling has cost {self._spent():.0f} s ({self.recompiles} recompiles), more "
                f"than the {self.decision.expected_saving_s:.0f} s it was expected to save"
            )

    def measured_speedup(self) -> float | None:
        if not self.compiled or not self.eager_step_s:
            return None
        return self.eager_step_s / statistics.median(self.compiled)

    def _judge_speed(self) -> None:
        speedup = self.measured_speedup()
        if speedup is not None and speedup <= 1.0 and not self.distributed:
            self._fall_back(
                f"compiled steps measured {statistics.median(self.compiled):.3g} s against "
                f"{self.eager_step_s:.3g} s eager ({speedup:.2f}x): no saving to repay the compile"
            )

    # --- at the end ----------------------------------------------------------------------------
    def mode(self) -> str:
        """eager | compiled | loaded (from the cache) | fell back to eager."""
        if self.state == "fell_back":
            return "fell back to eager"
        if self.state in ("eager", "probe"):
            return "eager"
        return "loaded" if self.cache_outcome == "hit" else "compiled"

    def report(self) -> dict[str, Any]:
        """``strategies["kernels.compile"]``: the decision, its inputs, and what happened."""
        out: dict[str, Any] = {
            "requested": self.requested,
            "resolved": self.state in ("compiling", "measuring", "compiled"),
            "mode": self.mode(),
            "why": self.why,
            "cache": self.cache_outcome,
            "cache_backend": self.cache,
            "compile_s": None if self.compile_s is None else round(self.compile_s, 2),
            "compile_s_source": (
                None
                if self.compile_s is None
                else "torch's compile clock"
                if self.compile_clocked
                else "the compiling step less an uncompiled one"
            ),
            "compile_step_s": (
                None if self.compile_step_s is None else round(self.compile_step_s, 2)
            ),
            # graphs dynamo compiled (a graph break or a new shape: one more), and recompiles
            # after the first compiled step
            "graphs": None
            if self._graphs_base is None
            else _counts()["graphs"] - self._graphs_base,
            "recompiles": self.recompiles,
            "recompile_s": round(self.recompile_s, 2),
            "eager_step_s": None if self.eager_step_s is None else round(self.eager_step_s, 4),
            "compiled_step_s": (
                round(statistics.median(self.compiled), 4) if self.compiled else None
            ),
            "measured_speedup": (
                None if self.measured_speedup() is None else round(self.measured_speedup(), 3)
            ),
            "batch_dim_dynamic": self.mark_batch_dynamic,
            "decided_at_step": self.decided_at,
            "fallback": self.fallback,
            "ledger_key": self.key,
        }
        if self.decision is not None:
            out["decision"] = self.decision.as_dict()
        if self.ledger.errors:
            out["ledger_errors"] = list(self.ledger.errors)
        return out

    def learn(self) -> None:
        """Write what this run measured into the ledger (the lead rank only)."""
        if not self.lead:
            return
        compiled = self.compile_s is not None
        loaded = self.cache_outcome == "hit"
        if not compiled and not self.probe:  # measured nothing
            return
        figures = learned(
            self.known,
            device_type=self.device_type,
            eager_step_s=self.eager_step_s if self.probe else None,
            compile_s=self.compile_s if compiled and not loaded else None,
            load_s=self.compile_s if compiled and loaded else None,
            speedup=self.measured_speedup(),
            cache=cache_name(self.cache) if compiled and self.fallback is None else None,
        )
        if figures != self.known:
            self.ledger.put(self.key, figures)


__all__ = [
    "CACHE_URL_ENV",
    "CompileControl",
    "CompileFigures",
    "configure_caches",
    "graph_shape",
    "is_compile_error",
]
