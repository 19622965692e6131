"""``train_local()``: parse nothing, build everything, train in this process, close, report.

``gpu_runtime.launch.train`` (``gpu_runtime.train``) calls it, or launches a DDP world whose
ranks each call it (``gpu_runtime.rank``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch.nn.parallel import DistributedDataParallel

from gpu_runtime.assembly import (
    AssembledModel,
    architecture_conflicts,
    assemble_model,
    strategy_conflicts,
)
from gpu_runtime.batching import MicroBatching
from gpu_runtime.capability import capability_problems, device_label, resolve_device
from gpu_runtime.checkpoint import load_checkpoint
from gpu_runtime.compile_payback import CompileLedger
from gpu_runtime.data import Corpus, SplitCorpus, StepBatches, load_corpus, load_split_corpus
from gpu_runtime.device_keys import device_class_of, resolve_device_keys
from gpu_runtime.errors import StrategyError
from gpu_runtime.evaluation import Evaluation, build_evaluation
from gpu_runtime.finetune import parameter_counts, save_result
from gpu_runtime.kernels.compiling import CACHE_URL_ENV, CompileControl, configure_caches
from gpu_runtime.live import live_poller
from gpu_runtime.mfu import peak_flops
from gpu_runtime.optim import build_adamw, load_optimizer_state
from gpu_runtime.placement import choose_device
from gpu_runtime.precision import Precision
from gpu_runtime.prefetch import Prefetcher
from gpu_runtime.probes import MIB, open_probe
from gpu_runtime.result import RunResult
from gpu_runtime.schema import StrategyConfig, config_sha256
from gpu_runtime.sources import ModelSource, mask_documents, open_model_source
from gpu_runtime.telemetry import Progress, RunCounters, Sampler
from gpu_runtime.timeline import Clock, OverlapMeter, StepWindow
from gpu_runtime.trainer import LoopOutcome, Trainer
from gpu_runtime.world import World

log = logging.getLogger(__name__)

# Strategy keys this runtime cannot apply. Refusing them beats training without them and
# reporting a cost the strategy never had.
_UNWIRED: list[tuple[str, Callable[[StrategyConfig], bool], str]] = []


def unwired_strategies(config: StrategyConfig) -> list[dict[str, str]]:
    """What the strategy asks for that this runtime would not do: unavailable keys and conflicts."""
    return [
        {"key": key, "message": message} for key, enabled, message in _UNWIRED if enabled(config)
    ] + strategy_conflicts(config)


def with_steps(config: StrategyConfig, steps: int | None) -> StrategyConfig:
    if steps is None:
        return config
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise StrategyError.single(
            "train.steps", f"steps must be a positive integer, got {steps!r}"
        )
    return config.model_copy(update={"train": config.train.model_copy(update={"steps": steps})})


def _check_memory(
    n: int, config: StrategyConfig, device: torch.device, what: str, key: str
) -> None:
    """Refuse a model whose weights, gradients and AdamW state cannot fit before allocating them.

    ``n`` parameters; under LoRA only about 1 % of them (the adapters) have gradients and
    optimizer state."""
    storage = 2 if config.precision.storage_dtype != "fp32" else 4
    master = 4 if config.precision.storage_dtype != "fp32" else 0
    trained = n // 100 if config.finetune.method == "lora" else n
    need = n * storage + trained * (storage + master + 8)  # grads, fp32 masters, two moments
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = psutil.virtual_memory().available
    if need > free:
        raise StrategyError.single(
            key,
            (
                f"{what} ({n / 1e9:.2f}B parameters) needs about {need / 2**30:.1f} GiB for "
                f"weights, gradients and optimizer state; {device_label(device)} has "
                f"{free / 2**30:.1f} GiB free"
            ),
        )


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[threading.Event]:
    """A flag set by SIGTERM inside the block, the handler before restored after it (main thread
    only: signals cannot be caught elsewhere). Training uses it; so does the worker around a
    run's setup (workers.training)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _deterministic(enabled: bool) -> Iterator[None]:
    before = torch.are_deterministic_algorithms_enabled()
    if enabled:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _peak_mem_mb(
    device: torch.device, sampler: Sampler | None, batching: MicroBatching
) -> float | None:
    if device.type == "cuda":
        return max(torch.cuda.max_memory_allocated(device), batching.run_peak_bytes) / MIB
    rss = psutil.Process().memory_info().rss / MIB
    return max(rss, sampler.peak_mem_mb if sampler is not None else 0.0)


def _resume(
    path: str,
    config: StrategyConfig,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    dataset_sha256: str,
) -> tuple[int, int]:
    state = load_checkpoint(path, config, mmap=config.offload.mmap)
    try:
        module.load_state_dict(state.model)
        load_optimizer_state(optimizer, state.optimizer)
    except (
        RuntimeError,
        ValueError,
    ) as exc:  # e.g. saved with quantization off, resumed with it on
        raise StrategyError.single(
            "resume_from",
            f"the checkpoint does not fit this strategy's model: {str(exc).splitlines()[0][:300]}",
        ) from None
    precision.scaler.load_state_dict(state.scaler)
    if precision.masters is not None and state.masters is not None:
        precision.masters.load_state(state.masters)
    if state.dataset_sha256 != dataset_sha256:
        log.warning(
            "resuming on different data: checkpoint %s, now %s",
            state.dataset_sha256,
            dataset_sha256,
        )
    return state.step, state.tokens


def refuse_what_the_host_cannot_run(config: StrategyConfig, dev: torch.device) -> None:
    problems = capability_problems(config, dev)
    problems += [
        p for p in unwired_strategies(config) if p["key"] not in {q["key"] for q in problems}
    ]
    if problems:
        raise StrategyError(problems)


class _Shard:
    """A rank's share of every step's global batch: the same rows a single process trains on,
    split."""

    def __init__(self, batches: StepBatches, world: World):
        self.batches, self.world = batches, world

    def batch(self, step: int) -> torch.Tensor:
        return self.world.shard(self.batches.batch(step))


def _per_rank(config: StrategyConfig, world_size: int) -> StrategyConfig:
    """The batch keys as one rank sees them: its share of the global batch, micro-batches within
    it."""
    share = config.train.global_batch // world_size
    micro = None if config.train.micro_batch is None else min(config.train.micro_batch, share)
    return config.model_copy(
        update={
            "train": config.train.model_copy(update={"global_batch": share, "micro_batch": micro})
        }
    )


def _ddp(module: torch.nn.Module, dev: torch.device) -> DistributedDataParallel:
    """DDP over the assembled model. Its buffers (the rotary tables) are the same on every rank by
    construction: no per-forward buffer broadcast (the flag is deprecated in name only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedDataParallel(
            module, device_ids=[dev.index] if dev.type == "cuda" else None, broadcast_buffers=False
        )


def compile_control(config, auto, dev, profile, module, start_step, world):
    """The run's CompileControl, or None where ``kernels.compile`` is false: torch's caches
    configured (Redis where COSTLAB_COMPILE_CACHE_URL answers), the ledger opened beside them."""
    report = auto.get("kernels.compile") or {}
    requested = "auto" if report.get("requested") == "auto" else config.kernels.compile
    if requested is False:
        return None
    cache = configure_caches()
    url = os.environ.get(CACHE_URL_ENV) if cache["remote"] else None
    return CompileControl(
        model=module,
        requested=requested,
        planned_steps=config.train.steps,
        start_step=start_step,
        device_type=dev.type,
        device_class=device_class_of(dev, profile),
        config=config,
        ledger=CompileLedger.default(url),
        cache=cache,
        # micro-batches of more than one size: the scaler's, or a global batch's short last one
        mark_batch_dynamic=config.optimizer.dynamic_batching.enabled
        or bool(config.train.micro_batch and config.train.global_batch % config.train.micro_batch),
        distributed=world is not None,
        lead=world is None or world.lead,
    )


def train_local(
    config: StrategyConfig,
    *,
    sink: Callable[[dict[str, Any]], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    device: str | None = None,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    live: Callable[[], dict[str, Any] | None] | None = None,
    world: World | None = None,
    profile=None,
    artifacts_dir: str | None = None,
) -> RunResult:
    """``train()`` in this process: alone, or as one rank of a ``world`` (its process group
    initialised)."""
    wall_start = time.perf_counter()
    config, auto, dev, placement = _place(config, device, world, profile)
    source = _open_source(config, dev, world)
    corpus, split, batches = _load_batches(config, source, world)
    torch.manual_seed(config.train.seed)
    precision = Precision(config.precision, dev)
    built, strategies, params = _assemble(config, dev, precision, source, batches, placement, auto)
    optimizer = _optimizer(config, built, strategies)
    batching = _micro_batching(config, world, built, dev)
    start_step = start_tokens = 0
    if resume_from is not None:
        start_step, start_tokens = _resume(
            resume_from, config, built.module, optimizer, precision, corpus.sha256
        )
    compiling = compile_control(config, auto, dev, profile, built.module, start_step, world)
    trainer = _trainer(
        config, built, compiling, optimizer, precision, dev, batching, corpus, checkpoint_dir, world
    )
    evaluation = _evaluation(config, split, trainer, built, precision, dev, world, strategies)
    meters = _start_meters(
        config, dev, world, sink, source, built, trainer, start_step, start_tokens
    )
    if evaluation is not None:
        # held while it evaluates; emits the evaluation's sample
        evaluation.sampler = meters.sampler
    outcome = _train_steps(
        config,
        trainer,
        batches,
        meters,
        dev=dev,
        world=world,
        profile=profile,
        start=(start_step, start_tokens),
        cancel=cancel,
        live=live,
        evaluation=evaluation,
    )
    if compiling is not None:
        strategies["kernels.compile"] = compiling.report()
        compiling.learn()
    artifacts = _save_artifacts(config, built, source, corpus, world, artifacts_dir)
    return _run_result(
        config,
        outcome,
        wall_start,
        meters,
        dev,
        batching,
        corpus,
        strategies,
        params,
        artifacts,
        evaluation,
    )


def _place(
    config: StrategyConfig, device: str | None, world: World | None, profile
) -> tuple[StrategyConfig, dict[str, dict[str, Any]], torch.device, dict]:
    """The device to train on, the config with its auto keys resolved there, auto's reports and
    placement's; refused where the host cannot run it (alone: a world's launcher checked)."""
    device, placement = choose_device(
        strategy=config.placement.strategy, gpus=config.placement.gpus, requested=device
    )
    dev = resolve_device(device)
    config, auto = resolve_device_keys(config, dev, profile)
    if world is None:
        refuse_what_the_host_cannot_run(config, dev)
    return config, auto, dev, placement


def _open_source(config: StrategyConfig, dev: torch.device, world: World | None) -> ModelSource:
    """The strategy's model source, refused where its architecture conflicts with the strategy
    (alone) or it cannot fit in the device's free memory."""
    source = open_model_source(config)
    if world is None:
        problems = architecture_conflicts(config, source.model_type, native=source.native)
        if problems:
            raise StrategyError(problems)
    _check_memory(source.params, config, dev, source.what, source.key)
    return source


def _load_batches(
    config: StrategyConfig, source: ModelSource, world: World | None
) -> tuple[Corpus, SplitCorpus | None, StepBatches | _Shard]:
    """The corpus trained on, the held-out split (None without ``eval``), and the step batches
    (this rank's share of them in a world)."""
    split = None
    if config.eval is None:
        corpus = load_corpus(config.data, seed=config.train.seed, tokenizer=source.tokenizer)
    else:  # the held-out records are never in the corpus trained on
        split = load_split_corpus(
            config.data, config.eval.holdout, seed=config.train.seed, tokenizer=source.tokenizer
        )
        corpus = split.train
    batches = StepBatches(
        corpus,
        seq_len=config.model.seq_len,
        global_batch=config.train.global_batch,
        seed=config.train.seed,
    )
    if world is not None:
        batches = _Shard(batches, world)
    return corpus, split, batches


def _assemble(
    config: StrategyConfig,
    dev: torch.device,
    precision: Precision,
    source: ModelSource,
    batches: StepBatches | _Shard,
    placement: dict,
    auto: dict[str, dict[str, Any]],
) -> tuple[AssembledModel, dict[str, Any], tuple[int, int]]:
    """Build and assemble the model; the strategies report begun, and (total, trainable)
    parameter counts."""
    module = source.build()
    packing = mask_documents(config, source, module)
    built = assemble_model(
        module, config, dev, precision, sample=batches.batch(0), model_type=source.model_type
    )
    params_total, params_trainable = parameter_counts(built.module)
    strategies = {
        "placement": placement,
        "model": {
            **source.report,
            "params_total": params_total,
            "params_trainable": params_trainable,
        },
        **built.report,
        **({"data.packing": packing} if packing else {}),
    }
    strategies.update(auto)
    return built, strategies, (params_total, params_trainable)


def _optimizer(
    config: StrategyConfig, built: AssembledModel, strategies: dict[str, Any]
) -> torch.optim.Optimizer:
    """AdamW over the assembled parameters, reported in ``strategies`` when fused."""
    optimizer = build_adamw(
        built.named_params, config.optimizer, config.train.lr, fused=config.kernels.fused_optimizer
    )
    if config.kernels.fused_optimizer:
        strategies["kernels.fused_optimizer"] = {
            "implementation": "torch.optim.AdamW(fused=True)",
            "parameters": len(built.named_params),
        }
    return optimizer


def _micro_batching(
    config: StrategyConfig, world: World | None, built: AssembledModel, dev: torch.device
) -> MicroBatching:
    """Micro-batching over this rank's share of each step's global batch."""
    world_size = 1 if world is None else world.world_size
    return MicroBatching(
        _per_rank(config, world_size), params=built.module.parameters(), device=dev
    )


def _trainer(
    config: StrategyConfig,
    built: AssembledModel,
    compiling: CompileControl | None,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    dev: torch.device,
    batching: MicroBatching,
    corpus: Corpus,
    checkpoint_dir: str | None,
    world: World | None,
) -> Trainer:
    """The Trainer over the model's forward (compiled, then DDP-wrapped in a world), bound to
    the compile control."""
    forward = built.forward if compiling is None else compiling.initial_forward(built.forward)
    forward = forward if world is None else _ddp(forward, dev)
    trainer = Trainer(
        config=config,
        model=built.module,
        forward=forward,
        optimizer=optimizer,
        precision=precision,
        device=dev,
        batching=batching,
        dataset_sha256=corpus.sha256,
        checkpoint_dir=checkpoint_dir,
        world=world,
        # prompts (loss_on: response), padding (packing false; packed records' row ends) and
        # each packed record's first token are read, not trained on
        count_trained=config.data.loss_on == "response" or not config.data.packing or corpus.packed,
    )
    if compiling is not None:
        compiling.bind(trainer)
    return trainer


def _evaluation(
    config: StrategyConfig,
    split: SplitCorpus | None,
    trainer: Trainer,
    built: AssembledModel,
    precision: Precision,
    dev: torch.device,
    world: World | None,
    strategies: dict[str, Any],
) -> Evaluation | None:
    """The held-out evaluation, reported in ``strategies``, or None without a split: its rows
    cut and moved to the device before the sampler starts."""
    if split is None:
        return None
    evaluation = build_evaluation(
        split.held_out,
        seq_len=config.model.seq_len,
        max_tokens=config.eval.max_tokens,
        rows_per_batch=trainer.micro_batch,  # the micro-batch training starts with fits
        every_steps=config.eval.every_steps,
        model=built.module,  # not the compiled or DDP wrapper
        autocast=precision.autocast,
        device=dev,
        world=world,
        report=split.report,
    )
    strategies["eval"] = evaluation.report
    return evaluation


@dataclass
class _Meters:
    """What measures the run as it trains: device label, counters, clock, step windows, I/O log
    and the telemetry sampler (None with telemetry off)."""

    label: str
    counters: RunCounters
    clock: Clock
    windows: deque[StepWindow]
    io_log: deque
    sampler: Sampler | None


def _start_meters(
    config: StrategyConfig,
    dev: torch.device,
    world: World | None,
    sink: Callable[[dict[str, Any]], None] | None,
    source: ModelSource,
    built: AssembledModel,
    trainer: Trainer,
    start_step: int,
    start_tokens: int,
) -> _Meters:
    """Reset the device's peak memory and start measuring: counters, clock and the sampler."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    label = device_label(dev)
    counters = RunCounters(Progress(start_step, start_tokens, 0.0, 0, None, trainer.micro_batch))
    clock = Clock(dev)
    windows: deque[StepWindow] = deque(maxlen=256)  # the sampler measures the newest 32 per sample
    io_log: deque = deque(maxlen=128)
    sampler = None
    if config.telemetry.enabled:
        sampler = Sampler(
            probe=open_probe(dev, cpu_tdp_w=config.telemetry.cpu_tdp_w),
            counters=counters,
            interval_s=config.telemetry.interval_s,
            sink=sink,
            flops_per_token=source.flops_per_token(built.module, config.model.seq_len),
            peak=peak_flops(label, config.precision.compute_dtype, config.telemetry.peak_flops),
            overlap=OverlapMeter(clock, windows, io_log),
            rank=0 if world is None else world.rank,
            devices=1 if world is None else world.world_size,
        ).start()
    return _Meters(label, counters, clock, windows, io_log, sampler)


def _train_steps(
    config: StrategyConfig,
    trainer: Trainer,
    batches: StepBatches | _Shard,
    meters: _Meters,
    *,
    dev: torch.device,
    world: World | None,
    profile,
    start: tuple[int, int],
    cancel: Callable[[], bool] | None,
    live: Callable[[], dict[str, Any] | None] | None,
    evaluation: Evaluation | None,
) -> LoopOutcome:
    """Run the trainer's loop under SIGTERM and the determinism flag, live keys applied at step
    boundaries; prefetcher and sampler closed after."""
    start_step, start_tokens = start
    sampler = meters.sampler

    def apply_live(updated: StrategyConfig) -> None:
        updated, _ = resolve_device_keys(updated, dev, profile)  # a ceiling edited to auto
        # the micro-batch bounds and window reach the BatchScaler here
        trainer.apply_config(updated)
        if sampler is not None:
            sampler.set_interval(updated.telemetry.interval_s)

    total = config.train.steps
    with stop_on_sigterm() as stop, _deterministic(config.train.deterministic):
        prefetcher = None
        try:
            prefetcher = Prefetcher(
                batches,
                start_step=start_step,
                end_step=total,
                device=dev,
                depth=config.data.prefetch,
                pin_memory=config.data.pin_memory,
                clock=meters.clock,
                io_log=meters.io_log,
            )
            agree = (
                None
                if world is None
                else world.boundary(stop=stop, current=lambda: trainer.config, apply=apply_live)
            )
            return trainer.run(
                prefetcher=prefetcher,
                start_step=start_step,
                total_steps=total,
                start_tokens=start_tokens,
                counters=meters.counters,
                clock=meters.clock,
                windows=meters.windows,
                cancel=cancel if world is None else lambda: world.cancelled,
                stop=stop,
                before_step=None
                if live is None
                else live_poller(live, current=lambda: trainer.config, apply=apply_live),
                agree=agree,
                evaluation=evaluation,
            )
        finally:
            if prefetcher is not None:
                prefetcher.close()
            if sampler is not None:
                sampler.stop()


def _save_artifacts(
    config: StrategyConfig,
    built: AssembledModel,
    source: ModelSource,
    corpus: Corpus,
    world: World | None,
    artifacts_dir: str | None,
) -> list[dict[str, Any]]:
    """Save what was trained where ``finetune.save`` asks (the lead rank only); the artifacts
    written."""
    if artifacts_dir is not None and config.finetune.save and (world is None or world.lead):
        return save_result(
            built.module,
            config.finetune,
            out_dir=artifacts_dir,
            native=source.native,
            model_type=source.model_type,
            checkpoint_path=config.model.path,
            config_sha256=config_sha256(config),
            dataset_sha256=corpus.sha256,
            lora_targets_used=built.report.get("finetune", {}).get("target_modules"),
        )
    return []


def _run_result(
    config: StrategyConfig,
    outcome: LoopOutcome,
    wall_start: float,
    meters: _Meters,
    dev: torch.device,
    batching: MicroBatching,
    corpus: Corpus,
    strategies: dict[str, Any],
    params: tuple[int, int],
    artifacts: list[dict[str, Any]],
    evaluation: Evaluation | None,
) -> RunResult:
    """The RunResult of a finished loop: what it trained, measured and saved."""
    wall_s = time.perf_counter() - wall_start
    sampler = meters.sampler
    params_total, params_trainable = params
    return RunResult(
        steps=outcome.steps,
        tokens=outcome.tokens,
        wall_s=wall_s,
        device_s=wall_s,  # one device per process
        energy_j=None if sampler is None else sampler.energy_j,
        energy_estimated=True if sampler is None else bool(sampler.probe.estimated),
        peak_mem_mb=_peak_mem_mb(dev, sampler, batching),
        final_loss=outcome.final_loss,
        dataset_sha256=corpus.sha256,
        config_sha256=config_sha256(config),
        device=meters.label,
        status=outcome.status,
        samples=0 if sampler is None else sampler.seq,
        micro_batch_events=batching.events,
        strategies=strategies,
        params_total=params_total,
        params_trainable=params_trainable,
        artifacts=artifacts,
        eval_loss=None if evaluation is None else evaluation.loss,
        eval_s=0.0 if evaluation is None else evaluation.seconds,
        evaluations=[] if evaluation is None else evaluation.history,
    )
