"""kernels.compile: auto compiles where it pays back over the run; compiled graphs are cached.

The payback rule is pure arithmetic (gpu_runtime.compile_payback); the controller acts on it in a
real train() of the tiny preset. A real inductor compile takes a minute on a 2-core CPU, so the
runs here compile with a wrapper that costs what the test says (or with dynamo's eager backend,
which traces for real); bench/compile_cache.py measures the real compile and the cache."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch
from torch._dynamo.exc import InternalTorchDynamoError

from gpu_runtime import runtime, train
from gpu_runtime.compile_payback import (
    PROBE_STEPS,
    CompileFigures,
    CompileLedger,
    decide,
    learned,
    prior,
)
from gpu_runtime.kernels.compiling import CompileControl, configure_caches
from gpu_runtime.trainer import Trainer


# --- the rule ---------------------------------------------------------------------------------
def test_auto_chooses_eager_for_a_30_step_run_and_compile_for_a_100k_step_run():
    """The same device, the same measurements: only the run's length differs."""
    figures = prior("cpu")  # a 90 s compile, 1.2x faster steps
    short = decide(planned_steps=30, done_steps=3, eager_step_s=0.5, figures=figures, cached=False)
    long = decide(
        planned_steps=100_000, done_steps=3, eager_step_s=0.5, figures=figures, cached=False
    )
    assert not short.compile and long.compile
    assert short.expected_saving_s == pytest.approx(27 * 0.5 * (1 - 1 / 1.2))
    assert long.expected_saving_s == pytest.approx(99_997 * 0.5 * (1 - 1 / 1.2))
    assert short.expected_cost_s == long.expected_cost_s == 90.0
    assert short.why.startswith("compiling does not pay: 27 remaining steps x 0.5 s")
    assert "estimated (priors" in short.why and long.as_dict()["figures"]["estimated"]


def test_a_cached_graph_makes_a_shorter_run_pay():
    figures = CompileFigures(compile_s=60.0, load_s=4.0, speedup=1.25, runs=2)
    cold = decide(planned_steps=600, done_steps=0, eager_step_s=0.5, figures=figures, cached=False)
    warm = decide(planned_steps=600, done_steps=0, eager_step_s=0.5, figures=figures, cached=True)
    assert (cold.compile, warm.compile) == (False, True)  # 60 s saved: > 1.5 x 4, < 1.5 x 60
    assert "loading the cached graph" in warm.why and "learned from 2 runs" in warm.why


def test_a_speedup_of_one_or_nothing_left_never_compiles():
    figures = CompileFigures(compile_s=0.001, load_s=0.001, speedup=1.0, runs=1)
    assert not decide(
        planned_steps=10**6, done_steps=0, eager_step_s=1.0, figures=figures, cached=True
    ).compile
    fast = CompileFigures(compile_s=0.001, load_s=0.001, speedup=3.0, runs=1)
    assert not decide(
        planned_steps=10, done_steps=10, eager_step_s=1.0, figures=fast, cached=True
    ).compile


def test_learned_figures_replace_the_priors_then_move_halfway():
    first = learned(None, device_type="cpu", compile_s=40.0, speedup=1.3, cache="redis")
    assert (first.compile_s, first.speedup, first.runs, first.caches) == (40.0, 1.3, 1, ("redis",))
    assert first.load_s == prior("cpu").load_s  # not measured: kept
    second = learned(first, device_type="cpu", load_s=3.0, speedup=1.1, cache="redis")
    assert second.load_s == pytest.approx(0.5 * 9.0 + 0.5 * 3.0)
    assert second.speedup == pytest.approx(1.2) and second.runs == 2
    assert second.caches == ("redis",)
    only_step = learned(None, device_type="cpu", eager_step_s=0.4)
    assert only_step.estimated and only_step.eager_step_s == 0.4


# --- the ledger and the caches -------------------------------------------------------------------
def test_the_ledger_round_trips_in_a_file_and_in_redis(tmp_path, redis_url):
    figures = CompileFigures(compile_s=30.0, load_s=2.0, speedup=1.25, runs=1, caches=("redis",))
    local = CompileLedger(path=tmp_path / "ledger.json")
    assert local.get("k") is None
    local.put("k", figures)
    assert CompileLedger(path=tmp_path / "ledger.json").get("k") == figures
    shared = CompileLedger(redis_url=redis_url)
    key = f"test-{time.time_ns()}"
    shared.put(key, figures)
    assert CompileLedger(redis_url=redis_url).get(key) == figures and not shared.errors


def test_a_ledger_or_cache_behind_a_dead_redis_learns_nothing_and_says_so():
    dead = "redis://127.0.0.1:1/0"
    ledger = CompileLedger(redis_url=dead)
    assert ledger.get("k") is None
    ledger.put("k", prior("cpu"))
    assert len(ledger.errors) == 2 and "ledger unreadable: ConnectionError" in ledger.errors[0]
    cache = configure_caches(dead)
    assert cache["remote"] is None and cache["local"] is True
    assert cache["why"].startswith("Redis unreachable (ConnectionError)")
    assert torch._inductor.config.fx_graph_remote_cache is False


def test_a_live_redis_shares_the_compiled_graphs(redis_url, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_REDIS_URL", raising=False)
    try:
        cache = configure_caches(redis_url)
        assert cache["remote"] == "redis"
        assert torch._inductor.config.fx_graph_remote_cache is True
        assert torch._functorch.config.enable_remote_autograd_cache is True
    finally:
        configure_caches("")  # back to local only for the rest of this process
        torch._inductor.config.fx_graph_remote_cache = None
        torch._functorch.config.enable_remote_autograd_cache = None


@pytest.fixture
def redis_url():
    from django.conf import settings

    if not settings.REDIS_URL:
        pytest.skip("no Redis")
    return settings.REDIS_URL


# --- the controller in a real run ---------------------------------------------------------------
class FakeCompiled(torch.nn.Module):
    """torch.compile's wrapper without the minutes: the first call costs ``compile_s``, every
    call ``extra_s`` more than the module."""

    def __init__(self, module, compile_s=0.0, extra_s=0.0):
        super().__init__()
        self._orig_mod, self.compile_s, self.extra_s, self.calls = module, compile_s, extra_s, 0

    def forward(self, *args):
        self.calls += 1
        time.sleep((self.compile_s if self.calls == 1 else 0.0) + self.extra_s)
        return self._orig_mod(*args)


@pytest.fixture
def ledger_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTLAB_COMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("COSTLAB_COMPILE_CACHE_URL", raising=False)
    return tmp_path


def seed(ledger_dir, config, figures: CompileFigures) -> None:
    """Put ``figures`` in the local ledger under this run's key."""
    from gpu_runtime.compile_payback import shape_key
    from gpu_runtime.device_keys import device_class_of
    from gpu_runtime.kernels.compiling import graph_shape

    resolved = config.model_copy(
        update={"kernels": config.kernels.model_copy(update={"compile": False})}
    )
    key = shape_key(device_class_of(torch.device("cpu")), torch.__version__, graph_shape(resolved))
    CompileLedger(path=ledger_dir / "compile_ledger.json").put(key, figures)


@pytest.fixture
def compiled(monkeypatch):
    """The wrappers the runs compile; ``compiled.make`` sets what each costs."""

    class Made(list):
        make = staticmethod(lambda module: FakeCompiled(module))

    made = Made()
    monkeypatch.setattr(
        CompileControl, "compile_fn", lambda self, m: made.append(made.make(m)) or made[-1]
    )
    return made


@pytest.fixture
def slow_eager(monkeypatch):
    """Eager steps cost 60 ms more than compiled ones: what compiling buys, made plain."""

    class SlowEager(Trainer):
        def train_step(self, step, total_steps, tokens):
            if not isinstance(self.forward, FakeCompiled):
                time.sleep(0.06)
            return super().train_step(step, total_steps, tokens)

    monkeypatch.setattr(runtime, "Trainer", SlowEager)


def cheap_figures(**extra) -> CompileFigures:
    return CompileFigures(
        **{"compile_s": 0.01, "load_s": 0.005, "speedup": 2.0, "runs": 1, **extra}
    )


def test_auto_probes_then_compiles_where_it_pays_and_the_next_run_decides_at_its_start(
    tiny_config, ledger_dir, compiled, slow_eager
):
    config = tiny_config(
        train={"steps": 8}, kernels={"compile": "auto"}, telemetry={"enabled": False}
    )
    seed(ledger_dir, config, cheap_figures())
    first = train(config, device="cpu")
    report = first.strategies["kernels.compile"]
    assert first.status == "completed" and first.steps == 8
    assert report["requested"] == "auto" and report["resolved"] is True
    assert report["mode"] == "compiled" and report["decided_at_step"] == PROBE_STEPS
    assert report["why"].startswith(f"compiling pays: {8 - PROBE_STEPS} remaining steps x ")
    assert report["decision"]["figures"]["learned_from_runs"] == 1
    assert len(compiled) == 1 and compiled[0].calls == 8 - PROBE_STEPS  # one micro-batch a step
    assert report["eager_step_s"] >= 0.06 and report["measured_speedup"] > 1.0

    ledger = json.loads((ledger_dir / "compile_ledger.json").read_text())["entries"]
    (learnt,) = ledger.values()
    assert learnt["eager_step_s"] == pytest.approx(report["eager_step_s"], rel=1e-3)
    assert learnt["runs"] == 2 and learnt["caches"]  # this host's cache holds the graph now

    second = train(config, device="cpu").strategies["kernels.compile"]
    assert second["decided_at_step"] == 0 and second["mode"] == "compiled"
    assert compiled[1].calls == 8  # compiled from the first step: the step time was learned


def test_auto_keeps_a_short_run_eager_and_says_why(tiny_config, ledger_dir, compiled, slow_eager):
    config = tiny_config(
        train={"steps": 6}, kernels={"compile": "auto"}, telemetry={"enabled": False}
    )
    seed(ledger_dir, config, CompileFigures(compile_s=60.0, load_s=6.0, speedup=1.2, runs=3))
    report = train(config, device="cpu").strategies["kernels.compile"]
    assert report["mode"] == "eager" and report["resolved"] is False and not compiled
    assert report["why"].startswith("compiling does not pay: 3 remaining steps x ")
    assert report["decision"]["expected_cost_s"] == 60.0


def test_a_failing_compile_falls_back_to_eager_and_trains_what_eager_trains(
    tiny_config, ledger_dir, compiled
):
    def failing(module):
        def forward(*args):
            raise InternalTorchDynamoError("inductor: the C++ build failed")

        return forward

    compiled.make = failing
    config = tiny_config(train={"steps": 4}, telemetry={"enabled": False})
    eager = train(config, device="cpu")
    fell = train(
        config.model_copy(update={"kernels": config.kernels.model_copy(update={"compile": True})}),
        device="cpu",
    )
    report = fell.strategies["kernels.compile"]
    assert fell.status == "completed" and fell.steps == 4 and fell.tokens == eager.tokens
    assert report["mode"] == "fell back to eager" and report["resolved"] is False
    assert report["fallback"] == (
        "the compile failed (InternalTorchDynamoError: inductor: the C++ build failed)"
    )
    assert fell.final_loss == pytest.approx(eager.final_loss, rel=1e-6)  # the step ran again


def test_compiled_steps_no_faster_than_eager_fall_back(tiny_config, ledger_dir, compiled):
    compiled.make = lambda module: FakeCompiled(module, extra_s=0.15)
    config = tiny_config(
        train={"steps": 9}, kernels={"compile": "auto"}, telemetry={"enabled": False}
    )
    seed(ledger_dir, config, cheap_figures())
    result = train(config, device="cpu")
    report = result.strategies["kernels.compile"]
    assert result.status == "completed" and result.steps == 9
    assert report["mode"] == "fell back to eager" and report["measured_speedup"] < 1.0
    assert "no saving to repay the compile" in report["fallback"]
    # the compile step, then two timed compiled steps; eager again from the next boundary
    assert compiled[0].calls == 1 + 2


def test_a_compile_dearer_than_its_saving_falls_back(tiny_config, ledger_dir, compiled, slow_eager):
    compiled.make = lambda module: FakeCompiled(module, compile_s=1.0)
    config = tiny_config(
        train={"steps": 8}, kernels={"compile": "auto"}, telemetry={"enabled": False}
    )
    # a 0.01-s compile buying 1.1x: pays over 5 steps, but saves well under the second it takes
    seed(ledger_dir, config, cheap_figures(speedup=1.1))
    report = train(config, device="cpu").strategies["kernels.compile"]
    # The compiling step took the fake's second; the compile is that step less an eager one (a
    # loaded machine slows the eager probe, so the figure is checked against its own inputs).
    assert report["mode"] == "fell back to eager" and report["compile_step_s"] >= 1.0
    assert report["compile_s"] == pytest.approx(
        report["compile_step_s"] - (report["eager_step_s"] or 0.0), abs=0.02
    )
    said = r"compiling has cost \d+ s \(0 recompiles\), more than the "
    assert re.match(said, report["fallback"]), report["fallback"]
    assert compiled[0].calls == 1
    ledger = json.loads((ledger_dir / "compile_ledger.json").read_text())["entries"]
    (learnt,) = ledger.values()
    assert learnt["compile_s"] == pytest.approx(0.5 * 0.01 + 0.5 * report["compile_s"], abs=0.01)


@pytest.mark.parametrize("marked", [True, False], ids=["batch-dynamic", "unmarked"])
def test_micro_batches_of_two_sizes_share_one_compiled_graph(
    tiny_config, ledger_dir, compiled, monkeypatch, marked
):
    """dynamo traces for real (its eager backend: no C++ build). A global batch of 6 in
    micro-batches of 4 runs rows 4 then 2 every step, as dynamic batching's sizes do: one graph
    where the batch dimension is marked dynamic, a recompile where it is not."""
    torch._dynamo.reset()
    compiled.make = lambda module: torch.compile(module, backend="eager")
    if not marked:  # what compile did before: every new micro-batch size a new graph
        monkeypatch.setattr(
            Trainer, "mark_batch_dynamic", property(lambda self: False, lambda self, value: None)
        )
    config = tiny_config(
        train={"steps": 3, "global_batch": 6, "micro_batch": 4},
        kernels={"compile": True},
        telemetry={"enabled": False},
    )
    result = train(config, device="cpu")
    report = result.strategies["kernels.compile"]
    assert result.status == "completed" and report["batch_dim_dynamic"] is True
    assert report["graphs"] == (1 if marked else 2), report
