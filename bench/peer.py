"""The peer benchmark: costlab against `transformers.Trainer`, same model, data, tokens and machine.

    python bench/peer.py [--quick] [--json] [--smoke] [--device cpu|cuda] [--rounds N]
                         [--tokens N] [--trainer-batch N] [--price-per-hour USD] [--budget-s S]
                         [--breakdown] [--unpacked] [--grouped] [--threads N]
                         [--clock auto|wall|cpu]

A team that does not use costlab fine-tunes its checkpoint with `transformers.Trainer`. This bench
trains the same checkpoint on the same records both ways, in one process, and compares what a
trained token costs, how good the model is after the same number of trained tokens, and what it
costs to reach the same quality (a target held-out loss).

The model: a tiny llama checkpoint built here by `gpu_runtime.tinyhf` (its own byte-level BPE
tokenizer, seeded weights) into a temporary directory: hidden 256, 4 layers, 4 heads, intermediate
688, seq_len 256 (3.4M parameters), so the matmuls are most of a step on a CPU. `--smoke`: hidden
64, 2 layers, seq_len 64, one round of 3 costlab steps: the same code path and JSON keys in
seconds (tests/bench/test_peer_smoke.py); its figures mean nothing.

The data: the shipped `gpu_runtime/datasets/instructions.jsonl` (Alpaca records) in the Alpaca
template, every record framed BOS + text + EOS and tokenized by the checkpoint's tokenizer (the
framing costlab's corpus gives a record, so both sides train on the same documents), truncated at
seq_len. The first 90 % of the records train; the last 10 % are held out and never trained on.

Arms, interleaved over rounds (the arm order rotated each round, so the machine's drift hits all):

* trainer_default: `Trainer` with `TrainingArguments` defaults: only output_dir,
  per_device_train_batch_size (`--trainer-batch`, 8: Trainer's own default), max_steps, the
  learning rate (costlab's 3e-4), report_to none, save_strategy no, logging_strategy no and
  disable_tqdm; collator `DataCollatorForLanguageModeling(tokenizer, mlm=False)` (dynamic padding
  to the longest record of the batch, padding labelled -100): every real token is trained on.
* trainer_best: the same, with the flags that are Trainer's best on this device (the JSON's
  `trainer_best_flags` says which and why): `bf16` only where the device profile says bf16 is
  native (`best_dtype(profile) == "bf16"`), gradient checkpointing off, the random sampler
  (Trainer's default), `dataloader_num_workers=0`, fused AdamW (`optim="adamw_torch_fused"`),
  the model's `attn_implementation` (sdpa or eager) that trains faster here, measured before the
  warm-up on short trainer_best runs (`choose_trainer_attention`; on an AVX-512 EPYC eager wins by
  ~1.3x), and `torch_compile` where costlab's payback rule says it pays over the Trainer's
  max_steps on the probe's step time (`trainer_compile`), as costlab's `kernels.compile: auto`
  decides for its own arm. Not the group-by-length sampler
  (`train_sampling_strategy="group_by_length"`), which trainer_best had until issue 43:
  it cuts padding, but at equal tokens it trains a model 7.9 % worse on held-out loss, so it
  never reaches the quality the Trainer reaches without it; a "best" that trains a worse model
  is not the best (docs/benchmarks.md). `--grouped` adds it back as a fifth arm,
  trainer_grouped (trainer_best + group_by_length).
* costlab_default: `gpu_runtime.train` with the default strategy for this model and data: family
  hf, init checkpoint, full fine-tune saved, jsonl alpaca, packing (the default), loss on all
  tokens, fp32.
* costlab_optimized: what costlab recommends on this device: `precision.compute_dtype: auto`
  (resolved from the profile), packing, `kernels.fused_optimizer`, `kernels.fused_rmsnorm_qkv`
  (a llama checkpoint trains as costlab's own Transformer), prefetch, `kernels.compile: auto`
  (its payback rule: eager for a run too short to repay a compile), `kernels.attention: auto`
  (math on a CPU); not dynamic batching, which has
  nothing to grow into here (below).

Equal work. Trainer's rows are records (~57 tokens each here), costlab's are rows of seq_len+1
tokens holding whole records (best fit, 4 % padding here; each record's first token is no
target, as in a Trainer row). So that both make about the same number of optimizer updates for
the same tokens (else the loss comparison would compare batch sizes, not runtimes), costlab's
global batch is the Trainer batch's trained tokens in rows: round(trainer batch x mean trained
tokens per record / trained tokens per packed row), at least 1 (2 here: ~485 trained tokens a
step against ~450), and its steps the target over that. Its
`train.micro_batch` is unset (= the global batch), so a step is one micro-batch already, and it
fits: dynamic batching, which grows a micro-batch from a smaller one toward the global batch,
could only add probe steps at smaller ones, so the optimized arm leaves it off and says why
(`costlab_optimized_choices`). Every arm trains the same number of trained tokens (`--tokens`;
the Trainer stops at the step nearest costlab's count, so within half a Trainer step), from the
same checkpoint.

Measured for every arm and round:

* trained tokens/s: tokens whose loss is trained (Trainer: `labels[:, 1:] != -100` of every batch
  it consumed, counted by a wrapped collator, i.e. padding excluded; costlab: RunResult.tokens).
  Timing starts at the second step (model loading and the first, warm-up step are excluded) and
  ends at the last step's start: a step's time is the gap between two step starts (costlab: its
  cancel callback; Trainer: `on_step_begin`), on this process's CPU time on a CPU (`--clock`;
  wall-clock figures alongside), wall clock on CUDA. Torch runs one intra-op thread on a CPU
  (`--threads`), as bench/arms.py does on a small shared machine.
* USD per 1M trained tokens: one ASSUMED device-hour price for every arm (bench/arms.py's
  ASSUMED_PRICE; `--price-per-hour` sets yours), so the cost ratios are inverse throughput ratios.
* peak memory: on a CPU the growth of the process's resident set over the arm (sampled every
  10 ms after freed memory is returned to the OS) and the process's peak RSS during it; on CUDA
  the allocator's maximum.
* eval loss at equal tokens: every arm's final model on the same held-out records, the same
  loss: mean next-token cross-entropy in fp32 over every token of them but each record's first
  (a Trainer with bf16 wraps its model's forward in bf16 autocast: the evaluation calls the
  forward it wrapped). costlab's model is read back from the weights it saved
  (`finetune.save: true`) with `AutoModelForCausalLM.from_pretrained`.
* an evaluation curve: the same held-out loss about EVAL_POINTS (16) times during each run,
  every k steps (`eval_every_steps`: 4 for every arm in --quick), between two steps: the
  Trainer's model in its `on_step_end`; costlab's module (the one train() trains, reached
  through arms.py's `capture_model`) copied under transformers' names into a transformers copy
  of the checkpoint, so every point of every arm is the same model code and loss. The untrained
  checkpoint is the curve's point at 0 tokens. Evaluation time is taken out of both clocks
  (`eval_s_excluded`): the benchmark compares training cost, and an evaluation is no part of
  a training step.
* cost to the target loss (`cost_to_target`): the target is, each round, the best (lowest)
  final eval loss among the Trainer arms (`target_loss`, `target_loss_arm`). An arm's cost to it
  is the trained tokens at which its curve first reaches it (within REACH_TOLERANCE, 0.1 %:
  fp32 and bf16 twins end 0.01 % apart), interpolated linearly between the two evaluations that
  straddle it, times the arm's measured USD per trained token (so it is the interpolation on
  cumulative cost); `usd` null and `why` where it never does. Median over the rounds that
  reached it, with min and max.

Headline: `ratio` = costlab_optimized's cost per trained token / trainer_best's (median over
rounds, with min and max); target <= 0.8 with costlab_optimized's eval loss at most 2 % above
trainer_best's (`loss_within_2pct`). `ratios` has every costlab arm over every Trainer arm.
Beside it, at equal quality: `ratio_to_quality` = costlab_optimized's cost to the target loss /
the cheapest Trainer arm's (`ratio_to_quality_vs`), per round, median with min and max
(`ratio_to_quality_spread`); null with `ratio_to_quality_why` where costlab_optimized never
reaches the target. `ratios_to_quality` has every costlab arm over every Trainer arm and over
the cheapest. The same the other way round, at the quality costlab_optimized reaches: with its
own final loss as the target (`costlab_loss_target`), `ratio_at_costlab_loss` = its cost to it /
the cheapest Trainer arm's (`ratio_at_costlab_loss_vs`), and each arm's `cost_to_costlab_loss`.
`where_time_goes` gives per arm the padding share, trained and processed tokens per step, time
per step and steps/s; Trainer arms also their forward+backward / optimizer / rest split (its
callbacks bracket the optimizer step). Where the ratio misses the target (or with
`--breakdown`, and always in `--smoke`), it adds an operator breakdown of trainer_best and
costlab_optimized: one short extra run each under torch.profiler, self time per category
(GEMM, attention, optimizer, loss, other aten ops, framework) in microseconds per trained token.

`--unpacked` adds a fifth arm, costlab_unpacked: costlab_optimized with `data.packing: false`
(one record a row, 8 rows a step as Trainer's, padded to the longest record rounded up to 8):
packing lets a document attend to the ones before it in its window, which costs attention
time and, on these short records, eval loss; this arm shows both without it.

`--quick`: 2 rounds of 28,672 trained tokens per arm (59 costlab steps), about 2-4 minutes on a
2-core CPU, within `--budget-s` (300 s with --quick: a round or breakdown that would not fit is
skipped, and the output says so). The default: 4 rounds of 57,344 tokens, about 12 minutes
unloaded.
SIGTERM: no further arm or round starts; the JSON of what was measured (`interrupted: true`)
and exit 143.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import torch  # noqa: E402
from _setup import INTERRUPTED_RC, Interrupted, Stopper  # noqa: E402  (bench/)
from _setup import spread as _spread  # noqa: E402
from arms import (  # noqa: E402  (bench/arms.py: one price table, one cost-to-quality rule)
    ASSUMED_PRICE,
    REACH_TOLERANCE,
    capture_model,
    cost_to_target,
    cost_to_target_rounds,
    quality_ratio,
    usd_per_million,
)

from gpu_runtime import strategy_from_dict, train  # noqa: E402
from gpu_runtime.capability import device_label, resolve_device  # noqa: E402
from gpu_runtime.data import alpaca_prompt, pack_records  # noqa: E402
from gpu_runtime.device_keys import device_profile  # noqa: E402
from gpu_runtime.profile import DeviceProfile, best_dtype, measure_profile  # noqa: E402

TARGET = 0.80  # costlab_optimized / trainer_best cost per trained token
LOSS_TOLERANCE = 0.02  # costlab_optimized's eval loss at most this fraction above trainer_best's
QUICK_BUDGET_S = 300.0
MIB = 2**20
LR = 3.0e-4  # costlab's default train.lr; the Trainer arms are given the same
DATASET = Path(__file__).resolve().parent.parent / "gpu_runtime" / "datasets" / "instructions.jsonl"
HELD_OUT = 0.10  # the last tenth of the records: never trained on, every arm evaluated on it
ARMS = ("trainer_default", "trainer_best", "costlab_default", "costlab_optimized")
TRAINER_ARMS = ("trainer_default", "trainer_best", "trainer_grouped")  # those a run has
EVAL_POINTS = 16  # held-out evaluations during a run (about; every k steps), besides the final
BREAKDOWN_STEPS = 4  # profiled steps of the operator breakdown (after two unprofiled ones)


# --- the model and the data ---------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    seq_len: int

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


FULL_SHAPE = Shape(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688, seq_len=256)
SMOKE_SHAPE = Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, seq_len=64)


def read_records(path: Path = DATASET) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def encode_record(tokenizer, record: dict[str, str], seq_len: int) -> list[int]:
    """BOS + the record in the Alpaca template + EOS (costlab's corpus framing), truncated."""
    ids = tokenizer.encode(alpaca_prompt(record), add_special_tokens=False)
    return ([tokenizer.bos_token_id] + ids + [tokenizer.eos_token_id])[:seq_len]


class Records(torch.utils.data.Dataset):
    """Tokenized records as Trainer takes them: {"input_ids": [...]} each."""

    def __init__(self, features: list[list[int]]):
        self.features = features

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.features[i]}


def eval_loss(model, held: list[list[int]], pad_id: int, device: torch.device) -> float:
    """Mean next-token cross-entropy (fp32) over every held-out token but each record's first;
    the model's train/eval mode is left as it was.

    In fp32 for every arm: a Trainer with `bf16` (accelerate) replaces the model's forward by
    one that runs it under bf16 autocast, which an outer autocast cannot turn off; the forward
    it wrapped (`_original_forward`) is called instead."""
    was_training = model.training
    forward = getattr(model, "_original_forward", None) or model
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        for i in range(0, len(held), 8):
            rows = held[i : i + 8]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, r in enumerate(rows):
                ids[j, : len(r)] = torch.tensor(r)
                mask[j, : len(r)] = 1
            ids, mask = ids.to(device), mask.to(device)
            logits = forward(input_ids=ids, attention_mask=mask).logits.float()
            targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            total += torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)),
                targets.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            ).item()
            count += int((targets != -100).sum())
    model.train(was_training)
    return total / count


class HFMirror:
    """A transformers copy of the checkpoint that evaluates costlab's module during its run:
    the module's weights, under transformers' names (what `finetune.save` writes), are copied
    in before each evaluation, so every arm is evaluated by the same model code and eval_loss."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.model = load_hf(plan.checkpoint, plan.dev)

    def loss(self, module: torch.nn.Module) -> float:
        from gpu_runtime.hf import hf_state_dict
        from gpu_runtime.model import Transformer

        state = hf_state_dict(module) if isinstance(module, Transformer) else module.hf.state_dict()
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:  # a tied head is saved once
            raise RuntimeError(f"weights do not map: missing {missing}, unexpected {unexpected}")
        return eval_loss(self.model, self.plan.held, self.plan.pad_id, self.plan.dev)


def load_hf(path: str | Path, device: torch.device, attn_implementation: str | None = None):
    from transformers import AutoModelForCausalLM

    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True, **extra
    ).to(device)


# --- measurement --------------------------------------------------------------------------------


class PeakMemory:
    """One arm's peak memory: the CUDA allocator's maximum, or on CPU the process's RSS sampled
    every 10 ms (its growth over the arm, after freed arenas go back to the OS, and its peak)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._stop = threading.Event()
        self.base = self.peak = 0

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        process = psutil.Process()
        self.base = self.peak = process.memory_info().rss

        def sample() -> None:
            while not self._stop.wait(0.01):
                self.peak = max(self.peak, process.memory_info().rss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict[str, float]:
        if self.device.type == "cuda":
            return {"peak_mem_mb": self.peak / MIB, "peak_rss_mb": None}
        return {"peak_mem_mb": (self.peak - self.base) / MIB, "peak_rss_mb": self.peak / MIB}


class StepClock:
    """Step starts on both clocks; optionally a torch.profiler window over some steps."""

    def __init__(self, device: torch.device, profile_steps: tuple[int, int] | None = None):
        self.device = device
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.profile_steps = profile_steps  # (first profiled step, steps profiled)
        self.profiler = None
        self.window: dict[str, float] = {}
        self.excluded = {"wall": 0.0, "cpu": 0.0}  # held-out evaluations: no part of a step

    @contextlib.contextmanager
    def excluding(self):
        """Time spent inside is taken out of both clocks (every later mark is that much
        earlier): a held-out evaluation between two steps costs the run nothing."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.excluded["wall"] += time.perf_counter() - wall
            self.excluded["cpu"] += time.process_time() - cpu

    def mark(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        index = len(self.wall)
        now_wall = time.perf_counter() - self.excluded["wall"]
        now_cpu = time.process_time() - self.excluded["cpu"]
        self.wall.append(now_wall)
        self.cpu.append(now_cpu)
        if self.profile_steps is not None:
            first, count = self.profile_steps
            if index == first:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if self.device.type == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.profiler = torch.profiler.profile(activities=activities)
                self.profiler.start()
                self.window = {"wall": now_wall, "cpu": now_cpu}
            elif index == first + count and self.profiler is not None:
                self.window = {
                    "wall": now_wall - self.window["wall"],
                    "cpu": now_cpu - self.window["cpu"],
                }
                self.profiler.stop()

    def rate(self, tokens_per_step: list[float]) -> dict[str, float] | None:
        """Trained tokens/s from the second step's start to the last step's start (the steps
        between: the first is warm-up and the last has no start after it)."""
        n = len(self.wall)
        if n < 3:
            return None
        tokens = sum(tokens_per_step[1 : n - 1])
        wall, cpu = self.wall[n - 1] - self.wall[1], self.cpu[n - 1] - self.cpu[1]
        return {
            "wall": tokens / wall,
            "cpu": tokens / max(cpu, 1e-9),
            "timed_steps": n - 2,
            "timed_tokens": tokens,
            "step_s_wall": wall / (n - 2),
            "step_s_cpu": cpu / (n - 2),
        }


def op_breakdown(profiler, window: dict[str, float], tokens: float, cuda: bool) -> dict:
    """Self time per operator category over the profiled steps, in microseconds per trained
    token, and the share of each; `framework` is the self time of what is not an aten operator
    (autograd engine, optimizer and module wrappers, record_function scopes)."""
    categories = {
        k: 0.0 for k in ("gemm", "attention", "optimizer", "loss", "other_aten", "framework")
    }
    top: list[tuple[str, float]] = []
    for event in profiler.key_averages():
        us = float(event.self_device_time_total if cuda else event.self_cpu_time_total)
        name = event.key
        if us <= 0 or name.startswith("ProfilerStep"):
            continue
        low = name.lower()
        if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv"):
            cat = "gemm"
        elif "scaled_dot_product" in low or "attention" in low or "flash" in low:
            cat = "attention"
        elif "adam" in low or name.startswith("aten::_foreach"):
            cat = "optimizer"
        elif "softmax" in low or "nll_loss" in low or "cross_entropy" in low:
            cat = "loss"
        elif name.startswith("aten::"):
            cat = "other_aten"
        else:
            cat = "framework"
        categories[cat] += us
        top.append((name, us))
    total = sum(categories.values()) or 1.0
    top.sort(key=lambda x: -x[1])
    return {
        "us_per_trained_token": {k: v / tokens for k, v in categories.items()},
        "share": {k: v / total for k, v in categories.items()},
        "op_self_time_s": total / 1e6,
        "window_s": window,
        "trained_tokens": tokens,
        "top_ops_us_per_token": {name: us / tokens for name, us in top[:8]},
        "time": "device self time"
        if cuda
        else "operator self time on the wall clock (torch.profiler, inflated alike by its own "
        "overhead and by other tenants' load: compare window_s wall with cpu)",
    }


# --- the arms -----------------------------------------------------------------------------------


@dataclass
class Plan:
    """Everything the arms share: sizes, the checkpoint, the data, the token target."""

    ns: argparse.Namespace
    dev: torch.device
    profile: DeviceProfile
    best: str
    price: float
    shape: Shape
    workdir: Path
    checkpoint: Path
    train_path: Path
    train_features: list[list[int]]
    held: list[list[int]]
    pad_id: int
    costlab_batch: int
    costlab_steps: int
    target_tokens: int
    trainer_max_steps: int
    mean_trained_per_record: float
    tokenizer: Any
    packed_padding_share: float = 0.0  # of costlab's packed rows, over an epoch
    trained_per_row: float = 0.0  # trained tokens of a packed row, over an epoch
    trainer_attention: str = "sdpa"  # trainer_best's attn_implementation (measured)
    trainer_eval_every: int = 1  # a Trainer arm's held-out evaluations: every this many steps
    arms: tuple[str, ...] = ARMS
    notes: list[str] = field(default_factory=list)


def costlab_configs(plan: Plan) -> tuple[dict[str, dict], dict[str, str]]:
    """(config per costlab arm, why dynamic batching is on or off)."""
    s = plan.shape
    default = {
        "model": {"family": "hf", "path": str(plan.checkpoint), "seq_len": s.seq_len},
        "data": {"source": "jsonl", "path": str(plan.train_path), "format": "alpaca"},
        "train": {
            "init": "checkpoint",
            "steps": plan.costlab_steps,
            "global_batch": plan.costlab_batch,
            "lr": LR,
            "seed": 0,
        },
        "finetune": {"method": "full", "save": True},
        "telemetry": {"enabled": False},  # its cost is bench/runtime_overhead.py's subject
    }
    optimized = copy.deepcopy(default)
    optimized["precision"] = {"compute_dtype": "auto"}
    optimized["kernels"] = {
        "fused_optimizer": True,
        "fused_rmsnorm_qkv": True,
        "compile": "auto",
        "attention": "auto",
    }
    optimized["data"].update({"packing": True, "prefetch": 2})
    why = (
        f"off: train.micro_batch unset runs the global batch ({plan.costlab_batch} rows) as one "
        "micro-batch, and it fits; dynamic batching grows a micro-batch from a smaller one toward "
        "the global batch (or halves it on out-of-memory), so here it could only add probe "
        "steps at smaller micro-batches"
    )
    configs = {"costlab_default": default, "costlab_optimized": optimized}
    choices = {"dynamic_batching": why}
    if plan.ns.unpacked:
        longest = max(len(f) for f in plan.train_features)
        width = min(plan.shape.seq_len, -(-longest // 8) * 8)
        unpacked = copy.deepcopy(optimized)
        unpacked["model"]["seq_len"] = width
        unpacked["data"]["packing"] = False
        unpacked["train"]["global_batch"] = plan.ns.trainer_batch
        unpacked["train"]["steps"] = max(
            3, round(plan.target_tokens / (plan.ns.trainer_batch * plan.mean_trained_per_record))
        )
        configs["costlab_unpacked"] = unpacked
        choices["unpacked"] = (
            f"costlab_optimized with packing false: one record per row, {plan.ns.trainer_batch} "
            f"rows a step as Trainer's, padded to seq_len {width} (the longest record, rounded up "
            "to 8); no document shares a row, so none attends to another"
        )
    return configs, choices


def trainer_flags(plan: Plan) -> tuple[dict[str, dict], dict[str, dict[str, Any]]]:
    """(TrainingArguments extras per Trainer arm, trainer_best's flags with the reason for each)."""
    import dataclasses

    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    bf16 = plan.best == "bf16"
    wanted: dict[str, tuple[Any, str]] = {
        "bf16": (
            bf16,
            "the device profile's best dtype is bf16 (native)"
            if bf16
            else f"off: the device profile's best dtype is {plan.best}; bf16 is not native here "
            "(emulated, far slower than fp32)",
        ),
        "gradient_checkpointing": (
            False,
            "off: the model and batch fit; recomputing activations only costs time",
        ),
        "train_sampling_strategy": (
            "random",
            "random (Trainer's default), not group_by_length: group_by_length cuts padding "
            "(24 % to 4 % in --quick) but at equal tokens trains a worse model, held-out loss "
            "3.513 against 3.256, +7.9 % (--quick on an Intel Xeon with AMX, 2026-12-06), so it "
            "never reaches the quality the Trainer reaches without it: a best that trains a "
            "worse model is not the best (docs/benchmarks.md; --grouped adds it back as the "
            "arm trainer_grouped)",
        ),
        "dataloader_num_workers": (
            0,
            "tokenized records in memory: collating in worker processes only adds IPC",
        ),
        "optim": ("adamw_torch_fused", "one fused kernel per parameter group (CPU and CUDA)"),
        "torch_compile": (
            False,
            "decided after the attention probe by costlab's kernels.compile payback rule "
            "(trainer_compile)",
        ),
    }
    grouped = {"train_sampling_strategy": "group_by_length"}
    if "train_sampling_strategy" not in fields and "group_by_length" in fields:
        wanted["group_by_length"] = (False, wanted.pop("train_sampling_strategy")[1])
        grouped = {"group_by_length": True}  # transformers 4's spelling
    best: dict[str, Any] = {}
    used: dict[str, dict[str, Any]] = {}
    for name, (value, why) in wanted.items():
        if name in fields:
            best[name] = value
            used[name] = {"value": value, "why": why}
        else:
            used[name] = {"value": None, "why": f"not a TrainingArguments field here: {why}"}
    extras = {"trainer_default": {}, "trainer_best": best}
    if "trainer_grouped" in plan.arms:
        extras["trainer_grouped"] = {**best, **grouped}
    return extras, used


TRAINER_ATTENTION_PROBE_STEPS = 12  # steps per probe run; two runs of each implementation


def trainer_compile(plan: Plan, attention: dict[str, Any]) -> dict[str, Any]:
    """trainer_best's torch_compile, by the payback rule costlab's kernels.compile: auto applies
    (gpu_runtime.compile_payback): the Trainer's eager step time from the attention probe, its
    max_steps, and the compile figures learned on this device class (or the priors)."""
    from gpu_runtime.compile_payback import decide, prior

    rate = attention["measured_tokens_per_s"].get(attention["value"])
    if not rate:
        return {"value": False, "why": "off: the attention probe measured no step time"}
    step_tokens = plan.ns.trainer_batch * plan.mean_trained_per_record
    decision = decide(
        planned_steps=plan.trainer_max_steps,
        done_steps=0,
        eager_step_s=step_tokens / rate,
        figures=prior(plan.dev.type),
        cached=False,
    )
    return {
        "value": decision.compile,
        "why": f"{'on' if decision.compile else 'off'}, as costlab's kernels.compile auto "
        f"decides: {decision.why}",
        "decision": decision.as_dict(),
    }


def choose_trainer_attention(plan: Plan, stopper: Stopper | None, extra: dict) -> dict[str, Any]:
    """trainer_best's attn_implementation: sdpa (transformers' default) or eager, whichever
    trains faster here, measured on short runs of trainer_best itself (alternated, the better
    of two each). Sets plan.trainer_attention; returns the flag with its figures."""
    rates: dict[str, list[float]] = {"sdpa": [], "eager": []}
    for _ in range(2):
        for impl in rates:
            out = run_trainer(
                plan,
                "trainer_best",
                extra,
                stopper,
                target_tokens=10**12,
                max_steps=TRAINER_ATTENTION_PROBE_STEPS,
                evaluate=False,
                attention=impl,
            )
            if out["rate"]:
                rates[impl].append(out["rate"][plan.ns.clock])
    best = {impl: max(r) for impl, r in rates.items() if r}
    plan.trainer_attention = max(best, key=best.get) if best else "sdpa"
    figures = ", ".join(f"{impl} {tps:.0f}" for impl, tps in best.items())
    return {
        "value": plan.trainer_attention,
        "why": f"measured here, trained tokens/s of trainer_best over "
        f"{TRAINER_ATTENTION_PROBE_STEPS} steps (best of 2): {figures}; "
        "from_pretrained(attn_implementation=...), a model "
        "setting rather than a TrainingArguments field",
        "measured_tokens_per_s": best,
    }


class CountingCollator:
    """Trainer's collator, unchanged, plus what each batch holds: trained targets
    (labels[:, 1:] != -100), positions processed, padded positions. A queue, as the data loader
    collates a batch ahead of the step that uses it."""

    def __init__(self, collator):
        self.collator = collator
        self.pending: deque[tuple[int, int, int, int]] = deque()

    def __call__(self, features):
        batch = self.collator(features)
        labels, mask = batch["labels"], batch["attention_mask"]
        self.pending.append(
            (
                int((labels[:, 1:] != -100).sum()),
                mask.numel(),
                int((mask == 0).sum()),
                mask.size(1),  # the padded width attention runs over
            )
        )
        return batch


def run_trainer(
    plan: Plan,
    name: str,
    extra: dict,
    stopper: Stopper | None,
    *,
    target_tokens: int | None = None,
    max_steps: int | None = None,
    profile_steps: tuple[int, int] | None = None,
    evaluate: bool = True,
    attention: str | None = None,
) -> dict[str, Any]:
    """One Trainer run; ``attention``: the model's attn_implementation (None: transformers'
    default, sdpa; trainer_best: the one measured faster here, plan.trainer_attention)."""
    from transformers import (
        DataCollatorForLanguageModeling,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    if stopper is not None:
        stopper.check()
    target = plan.target_tokens if target_tokens is None else target_tokens
    out_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=plan.workdir))
    clock = StepClock(plan.dev, profile_steps)
    collator = CountingCollator(DataCollatorForLanguageModeling(plan.tokenizer, mlm=False))
    steps: list[tuple[int, int, int, int]] = []
    split = {"fwd_bwd": 0.0, "optimizer": 0.0, "rest": 0.0}
    half_step = plan.ns.trainer_batch * plan.mean_trained_per_record / 2
    t: dict[str, float] = {}
    curve: list[tuple[int, float]] = []  # (trained tokens so far, held-out loss), during the run
    every = plan.trainer_eval_every

    class Measure(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock.mark()
            t["begin"] = time.process_time()
            if "end" in t and len(steps) >= 2:  # the rest: logging, bookkeeping, the next batch
                split["rest"] += t["begin"] - t["end"]

        def on_pre_optimizer_step(self, args, state, control, **kw):
            t["pre"] = time.process_time()

        def on_optimizer_step(self, args, state, control, **kw):
            t["opt"] = time.process_time()

        def on_step_end(self, args, state, control, model=None, **kw):
            steps.append(collator.pending.popleft())
            if len(steps) >= 2:  # the first step is warm-up
                split["fwd_bwd"] += t["pre"] - t["begin"]
                split["optimizer"] += t["opt"] - t["pre"]
            trained = sum(s[0] for s in steps)
            # stop at the step nearest the target: within half a step of it, or past it
            if trained + half_step >= target or (stopper is not None and stopper.stopped):
                control.should_training_stop = True
            elif evaluate and len(steps) % every == 0:  # the final model is evaluated after
                with clock.excluding():
                    curve.append((trained, eval_loss(model, plan.held, plan.pad_id, plan.dev)))
            t["end"] = time.process_time()

    args = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=plan.ns.trainer_batch,
        max_steps=plan.trainer_max_steps if max_steps is None else max_steps,
        learning_rate=LR,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=plan.dev.type == "cpu",
        **extra,
    )
    model = load_hf(plan.checkpoint, plan.dev, attention)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Records(plan.train_features),
        data_collator=collator,
        callbacks=[Measure()],
    )
    trainer.remove_callback(PrinterCallback)  # its end-of-train line: output only
    try:
        with PeakMemory(plan.dev) as memory:
            trainer.train()
        if stopper is not None and stopper.stopped:
            raise Interrupted
        trained = [s[0] for s in steps]
        rate = clock.rate(trained)
        loss = (
            eval_loss(trainer.model, plan.held, plan.pad_id, plan.dev)
            if evaluate and rate
            else None
        )
        positions = sum(s[1] for s in steps)
        result = {
            "rate": rate,
            "eval_loss": loss,
            "eval_curve": [] if loss is None else [*curve, (sum(trained), loss)],
            "eval_every_steps": every,
            "eval_s": dict(clock.excluded),
            "trained_tokens": sum(trained),
            "steps": len(steps),
            "trained_tokens_per_step": sum(trained) / max(len(steps), 1),
            "positions_per_step": positions / max(len(steps), 1),
            "padding_share": sum(s[2] for s in steps) / max(positions, 1),
            # keys attended per query, on average: a causal row of width W attends (W + 1) / 2
            "attention_context": sum(s[1] * (s[3] + 1) / 2 for s in steps) / max(positions, 1),
            "cpu_split_s": dict(split),
            **memory.figures(),
        }
        if profile_steps is not None and clock.profiler is not None and clock.window:
            first, count = profile_steps
            tokens = sum(trained[first : first + count])
            result["ops"] = op_breakdown(
                clock.profiler, clock.window, tokens, plan.dev.type == "cuda"
            )
        return result
    finally:
        del trainer, model
        shutil.rmtree(out_dir, ignore_errors=True)
        gc.collect()


def run_costlab(
    plan: Plan,
    name: str,
    config: dict,
    stopper: Stopper | None,
    *,
    steps: int | None = None,
    profile_steps: tuple[int, int] | None = None,
    evaluate: bool = True,
) -> dict[str, Any]:
    if stopper is not None:
        stopper.check()
    if steps is not None:
        config = copy.deepcopy(config)
        config["train"]["steps"] = steps
    strategy = strategy_from_dict(config)
    artifacts = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=plan.workdir))
    clock = StepClock(plan.dev, profile_steps)
    total = strategy.train.steps
    every = max(1, round(total / EVAL_POINTS))
    curve: list[tuple[int, float]] = []  # (steps done, held-out loss), during the run
    mirror = HFMirror(plan) if evaluate else None  # loaded before the arm's memory is measured
    box: dict[str, Any] = {}

    def cancel() -> bool:
        clock.mark()
        done = len(clock.wall) - 1  # train() calls this before every step: the steps done
        module = box.get("module")
        if mirror is not None and module is not None and 0 < done < total and done % every == 0:
            with clock.excluding():
                curve.append((done, mirror.loss(module)))
        return stopper is not None and stopper.stopped

    try:
        with PeakMemory(plan.dev) as memory, capture_model() as box:
            result = train(
                strategy,
                device=str(plan.dev),
                cancel=cancel,
                profile=plan.profile,
                artifacts_dir=str(artifacts),
            )
        if result.status != "completed" or (stopper is not None and stopper.stopped):
            if stopper is not None:
                stopper.event.set()
            raise Interrupted
        per_step = result.tokens / max(result.steps, 1)
        rate = clock.rate([per_step] * result.steps)
        loss = None
        if evaluate and rate:
            model = load_hf(artifacts, plan.dev)  # the weights finetune.save wrote
            loss = eval_loss(model, plan.held, plan.pad_id, plan.dev)
            del model
        out = {
            "rate": rate,
            "eval_loss": loss,
            "eval_curve": []
            if loss is None
            else [*((done * per_step, x) for done, x in curve), (result.tokens, loss)],
            "eval_every_steps": every,
            "eval_s": dict(clock.excluded),
            "trained_tokens": result.tokens,
            "steps": result.steps,
            "trained_tokens_per_step": per_step,
            "positions_per_step": strategy.train.global_batch * strategy.model.seq_len,
            "padding_share": plan.packed_padding_share
            if strategy.data.packing
            else 1 - per_step / (strategy.train.global_batch * strategy.model.seq_len),
            "attention_context": (strategy.model.seq_len + 1) / 2,
            "final_train_loss": result.final_loss,
            "micro_batch_events": [
                (e["step"], e["kind"], e["old_micro_batch"], e["new_micro_batch"])
                for e in result.micro_batch_events
            ],
            "resolved": {
                k: v.get("resolved")
                for k, v in result.strategies.items()
                if isinstance(v, dict) and "resolved" in v
            },
            "artifacts": [a.get("path") for a in result.artifacts],
            **memory.figures(),
        }
        if profile_steps is not None and clock.profiler is not None and clock.window:
            out["ops"] = op_breakdown(
                clock.profiler,
                clock.window,
                per_step * profile_steps[1],
                plan.dev.type == "cuda",
            )
        return out
    finally:
        shutil.rmtree(artifacts, ignore_errors=True)
        gc.collect()


# --- the report ---------------------------------------------------------------------------------


@dataclass
class Bench:
    plan: Plan
    costlab: dict[str, dict]
    trainer: dict[str, dict]
    flags_used: dict[str, dict]
    dynamic_why: dict[str, str]
    rounds_planned: int
    started: float
    per_round: list[dict[str, dict]] = field(default_factory=list)
    breakdown: dict[str, Any] | None = None
    eval_init: float | None = None  # the checkpoint's own eval loss, before any training
    phase: str = "start"
    interrupted_during: str | None = None
    _emitted: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)


def spread(values: list[float]) -> dict[str, float] | None:
    return _spread(values, keys=("median", "min", "max")) if values else None


def _portable(configs: dict[str, dict], plan: Plan) -> dict[str, dict]:
    """The strategies as the report shows them: the temporary paths named, not spelled."""
    text = json.dumps(configs)
    text = text.replace(json.dumps(str(plan.checkpoint))[1:-1], "<tiny llama checkpoint>")
    text = text.replace(json.dumps(str(plan.train_path))[1:-1], "<instructions.jsonl, 90 %>")
    return json.loads(text)


def summarize(b: Bench, interrupted: bool) -> dict[str, Any]:
    plan, ns = b.plan, b.plan.ns
    rounds = [r for r in b.per_round if all(r[a]["rate"] for a in plan.arms)]
    arms: dict[str, dict[str, Any]] = {}
    for name in plan.arms:
        runs = [r[name] for r in rounds]
        if not runs:
            continue
        tps = [x["rate"][ns.clock] for x in runs]
        median_tps = statistics.median(tps)
        losses = [x["eval_loss"] for x in runs if x["eval_loss"] is not None]
        arms[name] = {
            "trained_tokens_per_s": median_tps,
            "trained_tokens_per_s_spread": spread(tps),
            "trained_tokens_per_s_wall": statistics.median(x["rate"]["wall"] for x in runs),
            "usd_per_1m_trained_tokens": usd_per_million(median_tps, plan.price),
            "peak_mem_mb": statistics.median(x["peak_mem_mb"] for x in runs),
            "peak_rss_mb": None
            if runs[0]["peak_rss_mb"] is None
            else max(x["peak_rss_mb"] for x in runs),
            "eval_loss": statistics.median(losses) if losses else None,
            "eval_loss_per_round": losses,
            "trained_tokens": statistics.median(x["trained_tokens"] for x in runs),
            "steps": statistics.median(x["steps"] for x in runs),
        }
        if name.startswith("costlab"):
            arms[name]["resolved"] = runs[-1]["resolved"]
            arms[name]["micro_batch_events"] = [x["micro_batch_events"] for x in runs]

    def ratio_of(costlab: str, trainer: str) -> dict[str, Any] | None:
        per = [r[trainer]["rate"][ns.clock] / r[costlab]["rate"][ns.clock] for r in rounds]
        wall = [r[trainer]["rate"]["wall"] / r[costlab]["rate"]["wall"] for r in rounds]
        s = spread(per)
        return None if s is None else {**s, "per_round": per, "wall_clock_per_round": wall}

    ours_arms = [a for a in plan.arms if a.startswith("costlab")]
    theirs_arms = [a for a in plan.arms if a in TRAINER_ARMS]
    ratios = {f"{c}/{t}": ratio_of(c, t) for c in ours_arms for t in theirs_arms}
    head = ratios["costlab_optimized/trainer_best"]
    ratio = None if head is None else head["median"]
    ours = arms.get("costlab_optimized", {}).get("eval_loss")
    theirs = arms.get("trainer_best", {}).get("eval_loss")
    delta = None if ours is None or theirs is None else (ours - theirs) / theirs
    where: dict[str, Any] = {}
    for name in plan.arms:
        runs = [r[name] for r in rounds]
        if not runs:
            continue
        step_s = statistics.median(x["rate"][f"step_s_{ns.clock}"] for x in runs)
        row = {
            "padding_share": statistics.median(x["padding_share"] for x in runs),
            "trained_tokens_per_step": statistics.median(
                x["trained_tokens_per_step"] for x in runs
            ),
            "positions_per_step": statistics.median(x["positions_per_step"] for x in runs),
            "attention_context": statistics.median(x["attention_context"] for x in runs),
            "step_s": step_s,
            "steps_per_s": 1 / step_s,
        }
        if name in theirs_arms:
            split = {
                k: statistics.median(x["cpu_split_s"][k] for x in runs)
                / max(statistics.median(x["steps"] for x in runs) - 1, 1)
                for k in ("fwd_bwd", "optimizer", "rest")
            }
            row["cpu_s_per_step"] = split
            row["cpu_s_per_step_note"] = (
                "process CPU time per step, over the steps after the first: forward+backward "
                "(step start to the optimizer step's start, gradient clipping included), "
                "optimizer, the rest (the next batch, logging)"
            )
        where[name] = row
    if b.breakdown is not None:
        where["op_breakdown"] = b.breakdown
        ours, theirs = b.breakdown.get("costlab_optimized"), b.breakdown.get("trainer_best")
        if ours and theirs:
            gap = {
                k: ours["us_per_trained_token"][k] - theirs["us_per_trained_token"][k]
                for k in ours["us_per_trained_token"]
            }
            where["op_gap_us_per_trained_token"] = dict(sorted(gap.items(), key=lambda x: -x[1]))
            where["op_gap_note"] = (
                "costlab_optimized minus trainer_best, profiler self time per trained token: "
                "positive = where costlab spends more"
            )
    quality = quality_figures(b, rounds, theirs_arms, ours_arms)
    for name, figures in quality.pop("arms").items():
        arms[name].update(figures)
    label = device_label(plan.dev)
    return {
        "ratio": ratio,
        "ratio_spread": None if head is None else {k: head[k] for k in ("median", "min", "max")},
        "ratio_per_round": None if head is None else head["per_round"],
        **quality,
        "ratios": ratios,
        "target": TARGET,
        "met": ratio is not None and ratio <= TARGET,
        "eval_loss_delta": delta,
        "loss_within_2pct": delta is not None and delta <= LOSS_TOLERANCE,
        "loss_rule": (
            "(costlab_optimized - trainer_best) / trainer_best eval loss <= 0.02, both after the "
            "same trained tokens, on the same held-out tokens"
        ),
        "eval_loss_init": b.eval_init,
        "arms": arms,
        "where_time_goes": where,
        "trainer_best_flags": b.flags_used,
        "trainer_arguments": {
            "common": {
                "per_device_train_batch_size": ns.trainer_batch,
                "max_steps": plan.trainer_max_steps,
                "learning_rate": LR,
                "report_to": "none",
                "save_strategy": "no",
                "logging_strategy": "no",
                "disable_tqdm": True,
                "use_cpu": plan.dev.type == "cpu",
            },
            **b.trainer,
            "collator": "DataCollatorForLanguageModeling(tokenizer, mlm=False)",
            "stops_at": f"the step nearest {plan.target_tokens} trained tokens",
        },
        "costlab_strategies": _portable(b.costlab, plan),
        "costlab_optimized_choices": b.dynamic_why,
        "device": f"{label} ({plan.profile.cpu_model})" if plan.dev.type == "cpu" else label,
        "cpu_model": plan.profile.cpu_model,
        "device_class": plan.profile.device_class,
        "torch_threads": torch.get_num_threads() if plan.dev.type == "cpu" else None,
        "best_dtype": plan.best,
        "profile": plan.profile.as_dict(),
        "profile_summary": {
            name: {"gflops": r.gflops, "native": r.native, "ratio_vs_fp32": r.ratio_vs_fp32}
            for name, r in plan.profile.dtypes.items()
        },
        "price_per_hour_usd": plan.price,
        "price_assumed": ns.price_per_hour is None,
        "clock": ns.clock,
        "model": {
            "arch": "llama",
            **plan.shape.as_dict(),
            "vocab_size": len(plan.tokenizer),
            "built_by": "gpu_runtime.tinyhf.build_checkpoint",
        },
        "data": {
            "records_trained": len(plan.train_features),
            "records_held_out": len(plan.held),
            "mean_trained_tokens_per_record": plan.mean_trained_per_record,
            "template": "alpaca, BOS + text + EOS",
        },
        "target_tokens_per_run": plan.target_tokens,
        "steps": {
            "costlab": plan.costlab_steps,
            "costlab_global_batch": plan.costlab_batch,
            "trainer_batch": ns.trainer_batch,
            "trainer_max_steps": plan.trainer_max_steps,
        },
        "rounds": len(rounds),
        "rounds_planned": b.rounds_planned,
        "budget_s": ns.budget_s or None,
        "peak_memory_method": "CUDA max allocated"
        if plan.dev.type == "cuda"
        else "RSS growth over the arm, sampled every 10 ms (estimate); peak_rss_mb: the process",
        "notes": list(plan.notes) + list(plan.profile.notes),
        "interrupted": interrupted,
        "interrupted_during": (b.interrupted_during or b.phase) if interrupted else None,
        "wall_s": time.perf_counter() - b.started,
    }


def quality_figures(
    b: Bench, rounds: list[dict[str, dict]], theirs: list[str], ours: list[str]
) -> dict[str, Any]:
    """Cost at equal quality. Each round's target is the best (lowest) final held-out loss of its
    Trainer arms; each arm's cost to reach it is read off its evaluation curve (arms.py's
    cost_to_target: the untrained checkpoint at 0 tokens, the evaluations during the run, the
    final model; trained tokens to the target x the run's USD per trained token). Headline:
    `ratio_to_quality` = costlab_optimized's cost to the target / the cheapest Trainer arm's,
    per round (median, min, max, as `ratio`); None with `ratio_to_quality_why` where an arm
    never reaches it."""
    plan, ns = b.plan, b.plan.ns
    start = [] if b.eval_init is None else [(0, b.eval_init)]
    targets: list[float] = []
    target_arms: list[str] = []
    costs: dict[str, list[dict]] = {name: [] for name in plan.arms}
    cheapest: list[dict] = []  # per round: the Trainer arm that reached the target for least
    cheapest_arms: list[str] = []
    # the other way round: costlab_optimized's own final loss as the target
    ours_targets: list[float] = []
    ours_costs: dict[str, list[dict]] = {name: [] for name in plan.arms}
    ours_cheapest: list[dict] = []
    ours_cheapest_arms: list[str] = []

    def cheapest_of(costs: dict[str, list[dict]]) -> tuple[str | None, dict]:
        reached = [t for t in theirs if costs[t][-1]["reached"]]
        if not reached:
            return None, costs[theirs[0]][-1]
        best = min(reached, key=lambda t: costs[t][-1]["usd"])
        return best, costs[best][-1]

    for r in rounds:
        if not all(r[name].get("eval_curve") for name in plan.arms):
            continue
        finals = {t: r[t]["eval_curve"][-1][1] for t in theirs}
        target_arm = min(finals, key=finals.get)
        target = finals[target_arm]
        targets.append(target)
        target_arms.append(target_arm)
        ours_target = r["costlab_optimized"]["eval_curve"][-1][1]
        ours_targets.append(ours_target)
        for name in plan.arms:
            usd_per_token = usd_per_million(r[name]["rate"][ns.clock], plan.price) / 1e6
            curve = start + list(r[name]["eval_curve"])
            costs[name].append(cost_to_target(curve, target, usd_per_token))
            ours_costs[name].append(cost_to_target(curve, ours_target, usd_per_token))
        best, cost = cheapest_of(costs)
        cheapest.append(cost)
        cheapest_arms.append(best)
        best, cost = cheapest_of(ours_costs)
        ours_cheapest.append(cost)
        ours_cheapest_arms.append(best)
    arms: dict[str, dict[str, Any]] = {}
    for name in plan.arms:
        runs = [r[name] for r in rounds if r[name].get("eval_curve")]
        if not runs:
            continue
        arms[name] = {
            "eval_curve": start + list(runs[-1]["eval_curve"]),
            "eval_every_steps": runs[-1]["eval_every_steps"],
            "eval_s_excluded": statistics.median(x["eval_s"][ns.clock] for x in runs),
            "cost_to_target": cost_to_target_rounds(costs[name]) if targets else None,
            "cost_to_costlab_loss": cost_to_target_rounds(ours_costs[name]) if targets else None,
        }

    def most(names: list[str | None]) -> str | None:
        known = [n for n in names if n is not None]
        return max(set(known), key=known.count) if known else None

    ratios = {
        f"{c}/{t}": quality_ratio(costs[c], costs[t]) for c in ours for t in theirs if targets
    }
    ratios.update(
        {f"{c}/cheapest_trainer": quality_ratio(costs[c], cheapest) for c in ours if targets}
    )
    head = ratios.get("costlab_optimized/cheapest_trainer")
    at_ours = quality_ratio(ours_costs["costlab_optimized"], ours_cheapest) if targets else None
    return {
        "ratio_to_quality": None if head is None else head["ratio"],
        "ratio_to_quality_spread": None if head is None else head["spread"],
        "ratio_to_quality_per_round": None if head is None else head["per_round"],
        "ratio_to_quality_vs": most(cheapest_arms),
        "ratio_to_quality_vs_per_round": cheapest_arms,
        "ratio_to_quality_why": "no held-out evaluation" if head is None else head["why"],
        "ratios_to_quality": ratios,
        "target_loss": statistics.median(targets) if targets else None,
        "target_loss_arm": most(target_arms),
        "target_loss_per_round": targets,
        "target_rule": (
            "the best (lowest) final held-out loss among the Trainer arms, each round; an arm's "
            f"cost to it = its trained tokens when its held-out loss first reaches it (within "
            f"{REACH_TOLERANCE:.1%}; interpolated between the two evaluations that straddle it) "
            "x its measured USD per trained token (evaluation time excluded); ratio_to_quality "
            "= costlab_optimized's cost to it / the cheapest Trainer arm's"
        ),
        "target_tolerance": REACH_TOLERANCE,
        # the same comparison at the quality costlab_optimized reaches (its own final loss)
        "costlab_loss_target": statistics.median(ours_targets) if ours_targets else None,
        "ratio_at_costlab_loss": None if at_ours is None else at_ours["ratio"],
        "ratio_at_costlab_loss_spread": None if at_ours is None else at_ours["spread"],
        "ratio_at_costlab_loss_per_round": None if at_ours is None else at_ours["per_round"],
        "ratio_at_costlab_loss_vs": most(ours_cheapest_arms),
        "ratio_at_costlab_loss_why": "no held-out evaluation"
        if at_ours is None
        else at_ours["why"],
        "arms": arms,
    }


def print_report(b: Bench, f: dict[str, Any]) -> None:
    plan, ns = b.plan, b.plan.ns
    s = plan.shape
    clock = "wall clock" if ns.clock == "wall" else "this process's CPU time (wall alongside)"
    threads = "" if plan.dev.type == "cuda" else f", torch threads {f['torch_threads']}"
    print(f"peer benchmark: costlab vs transformers.Trainer on {f['device']}{threads}")
    print(
        f"model: tiny llama (tinyhf) hidden {s.hidden}, {s.layers} layers, {s.heads} heads, "
        f"intermediate {s.intermediate}, seq_len {s.seq_len}, vocab {len(plan.tokenizer)}; data: "
        f"{len(plan.train_features)} Alpaca records trained, {len(plan.held)} held out"
    )
    print(
        f"equal work: {plan.target_tokens} trained tokens per arm (costlab {plan.costlab_steps} "
        f"steps x {plan.costlab_batch} packed rows of {s.seq_len}; Trainer batches of "
        f"{ns.trainer_batch} records, ~{plan.mean_trained_per_record:.0f} trained tokens each, "
        f"until the count is reached); {f['rounds']} interleaved rounds; step time: {clock}"
    )
    print(
        f"best dtype here: {f['best_dtype']}; price ${plan.price:.2f} per device-hour, "
        f"{'ASSUMED (--price-per-hour sets it)' if f['price_assumed'] else 'given'}"
    )
    if f["interrupted"]:
        print(f"INTERRUPTED (SIGTERM) during {f['interrupted_during']}: what was measured so far")
    print()
    print(
        f"{'arm':<18} {'trained tok/s':>13} {'(wall)':>8} {'USD/1M trained':>15} "
        f"{'peak MiB':>9} {'eval loss':>10} {'padding':>8} {'step s':>7} {'uUSD to target':>15}"
    )
    for name, a in f["arms"].items():
        w = f["where_time_goes"][name]
        loss = "-" if a["eval_loss"] is None else f"{a['eval_loss']:.4f}"
        to = a.get("cost_to_target") or {}
        usd = "not reached" if to.get("usd") is None else f"{to['usd'] * 1e6:.3f}"
        print(
            f"{name:<18} {a['trained_tokens_per_s']:>13.1f} {a['trained_tokens_per_s_wall']:>8.1f} "
            f"{a['usd_per_1m_trained_tokens']:>15.4f} {a['peak_mem_mb']:>9.1f} {loss:>10} "
            f"{w['padding_share']:>8.1%} {w['step_s']:>7.3f} {usd:>15}"
        )
    if f["eval_loss_init"] is not None:
        print(f"{'(checkpoint, untrained)':<18} eval loss {f['eval_loss_init']:.4f}")
    print()
    for key, r in f["ratios"].items():
        if r is not None:
            print(
                f"{key:<36} cost ratio {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f})"
            )
    if f["ratio"] is not None:
        print(
            f"\nratio (costlab_optimized / trainer_best USD per 1M trained tokens) = "
            f"{f['ratio']:.3f}  target <= {TARGET:.2f}: {'MET' if f['met'] else 'NOT MET'}"
        )
    if f["eval_loss_delta"] is not None:
        print(
            f"eval loss, costlab_optimized vs trainer_best: {f['eval_loss_delta']:+.2%}  "
            f"(within 2 %: {'yes' if f['loss_within_2pct'] else 'NO'})"
        )
    if f["target_loss"] is not None:
        print(
            f"\nat equal quality: target held-out loss {f['target_loss']:.4f} "
            f"({f['target_loss_arm']}'s final, the best Trainer arm's); cost to reach it "
            "(uUSD = 1e-6 USD; evaluation time excluded):"
        )
        for name, a in f["arms"].items():
            to = a.get("cost_to_target")
            if to is None:
                continue
            print(
                f"  {name:<18} "
                + (
                    f"{to['usd'] * 1e6:.3f} uUSD after {to['tokens']:,.0f} trained tokens"
                    if to["usd"] is not None
                    else f"not reached: {to['why']}"
                )
            )
        q, spread_q = f["ratio_to_quality"], f["ratio_to_quality_spread"]
        print(
            f"ratio_to_quality (costlab_optimized / {f['ratio_to_quality_vs']}, the cheapest "
            "Trainer arm to the target) = "
            + (
                f"{q:.3f} (min {spread_q['min']:.3f}, max {spread_q['max']:.3f})"
                if q is not None
                else "none"
            )
            + (f": {f['ratio_to_quality_why']}" if f["ratio_to_quality_why"] else "")
        )
        q, spread_q = f["ratio_at_costlab_loss"], f["ratio_at_costlab_loss_spread"]
        print(
            f"at costlab_optimized's own final loss {f['costlab_loss_target']:.4f} instead: "
            f"costlab_optimized / {f['ratio_at_costlab_loss_vs']} (the cheapest Trainer arm to "
            "it) = "
            + (
                f"{q:.3f} (min {spread_q['min']:.3f}, max {spread_q['max']:.3f})"
                if q is not None
                else "none"
            )
            + (f": {f['ratio_at_costlab_loss_why']}" if f["ratio_at_costlab_loss_why"] else "")
        )
    ops = f["where_time_goes"].get("op_breakdown")
    if ops:
        print("\nwhere the time goes (self time per trained token, us; torch.profiler):")
        cats = list(next(iter(ops.values()))["us_per_trained_token"])
        print(f"{'arm':<18} " + " ".join(f"{c:>10}" for c in cats))
        for name, o in ops.items():
            print(f"{name:<18} " + " ".join(f"{o['us_per_trained_token'][c]:>10.1f}" for c in cats))
    print("\ntrainer_best flags:")
    for name, flag in f["trainer_best_flags"].items():
        print(f"  {name} = {flag['value']!r}: {flag['why']}")
    for key, why in f["costlab_optimized_choices"].items():
        print(f"costlab_optimized {key}: {why}")
    for note in f["notes"]:
        print(f"note: {note}")
    print(f"wall time {f['wall_s']:.0f} s")


def emit(b: Bench, *, interrupted: bool, human: bool = True) -> int:
    with b._lock:
        if not b._emitted:
            b._emitted = True
            figures = summarize(b, interrupted)
            if human:
                print_report(b, figures)
            else:
                print(f"interrupted (SIGTERM) during {b.phase}: the step under way overran")
            if b.plan.ns.json:
                print(json.dumps(figures))
            sys.stdout.flush()
    return INTERRUPTED_RC if interrupted else 0


# --- main ---------------------------------------------------------------------------------------


def build_plan(ns: argparse.Namespace, dev: torch.device, profile: DeviceProfile) -> Plan:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from gpu_runtime.tinyhf import build_checkpoint

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    shape = SMOKE_SHAPE if ns.smoke else FULL_SHAPE
    workdir = Path(tempfile.mkdtemp(prefix="costlab-peer-"))
    checkpoint = build_checkpoint(
        workdir / "checkpoint",
        "llama",
        layers=shape.layers,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        intermediate=shape.intermediate,
        seq_len=shape.seq_len,
        seed=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    records = read_records()
    cut = len(records) - max(1, round(len(records) * HELD_OUT))
    train_path = workdir / "train.jsonl"
    train_path.write_text("".join(json.dumps(r) + "\n" for r in records[:cut]), encoding="utf-8")
    features = [encode_record(tokenizer, r, shape.seq_len) for r in records[:cut]]
    held = [encode_record(tokenizer, r, shape.seq_len) for r in records[cut:]]
    mean_trained = statistics.mean(len(f) - 1 for f in features)
    # costlab packs whole records into rows of seq_len+1 (gpu_runtime.data.pack_records): a
    # row trains each record but its first token, and the rest of the row is padding
    lengths = [len(f) for f in features]
    rows = pack_records(lengths, shape.seq_len + 1)
    per_row = (sum(lengths) - len(lengths)) / len(rows)
    padding = 1 - sum(lengths) / (len(rows) * (shape.seq_len + 1))
    batch = ns.costlab_batch or max(1, round(ns.trainer_batch * mean_trained / per_row))
    per_step = batch * per_row
    steps = max(3, round(ns.tokens / per_step))
    target = round(steps * per_step)
    # the Trainer's schedule length: its expected steps to the target, a margin to reach it
    max_steps = math.ceil(target / (ns.trainer_batch * mean_trained) * 1.1) + 2
    return Plan(
        ns=ns,
        dev=dev,
        profile=profile,
        best=best_dtype(profile),
        price=ns.price_per_hour if ns.price_per_hour is not None else ASSUMED_PRICE[dev.type],
        shape=shape,
        workdir=workdir,
        checkpoint=checkpoint,
        train_path=train_path,
        train_features=features,
        held=held,
        pad_id=tokenizer.pad_token_id,
        costlab_batch=batch,
        costlab_steps=steps,
        target_tokens=target,
        trainer_max_steps=max_steps,
        mean_trained_per_record=mean_trained,
        tokenizer=tokenizer,
        packed_padding_share=padding,
        trained_per_row=per_row,
        trainer_eval_every=max(1, round(target / (ns.trainer_batch * mean_trained) / EVAL_POINTS)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"2 rounds of 28,672 tokens: about 4 minutes on a 2-core CPU, never more than "
        f"--budget-s ({QUICK_BUDGET_S:.0f} s)",
    )
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--tokens", type=int, default=None, help="trained tokens per arm and run")
    parser.add_argument(
        "--trainer-batch",
        type=int,
        default=8,
        help="Trainer's per_device_train_batch_size (default 8, its own default)",
    )
    parser.add_argument(
        "--costlab-batch",
        type=int,
        default=None,
        help="costlab's train.global_batch (default: the Trainer batch's tokens in windows)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"wall-clock budget: a round that would not fit is skipped and said (--quick: "
        f"{QUICK_BUDGET_S:.0f}; otherwise none; 0: none)",
    )
    parser.add_argument(
        "--price-per-hour", type=float, default=None, help="USD per device-hour (default: assumed)"
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="always add the torch.profiler operator breakdown (default: when the ratio misses "
        "its target)",
    )
    parser.add_argument(
        "--unpacked",
        action="store_true",
        help="one more arm, costlab_unpacked: costlab_optimized with packing false (one record "
        "a row, padded to the longest record): what packing does to the eval loss",
    )
    parser.add_argument(
        "--grouped",
        action="store_true",
        help="one more arm, trainer_grouped: trainer_best with group_by_length (what trainer_best "
        "was before issue 43): less padding, a worse model at equal tokens",
    )
    parser.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on CPU (default 1, as bench/arms.py; 0 keeps torch's)",
    )
    ns = parser.parse_args()
    stopper = Stopper().install()
    started = time.perf_counter()
    dev = resolve_device(ns.device)
    cuda = dev.type == "cuda"
    if ns.threads and not cuda:
        torch.set_num_threads(ns.threads)
    ns.clock = ns.clock if ns.clock != "auto" else ("wall" if cuda else "cpu")
    rounds = ns.rounds or (1 if ns.smoke else 2 if ns.quick else 4)
    ns.tokens = ns.tokens or (1 if ns.smoke else 28_672 if ns.quick else 57_344)
    if ns.budget_s is None:
        ns.budget_s = QUICK_BUDGET_S if ns.quick and not ns.smoke else 0.0
    deadline = started + ns.budget_s if ns.budget_s else None

    profile = measure_profile(dev, budget_s=0.5 if ns.smoke else None)
    device_profile(dev, profile)  # this process's cache: train() gets `profile=` anyway
    plan = build_plan(ns, dev, profile)
    if ns.grouped:
        plan.arms = (*plan.arms[:2], "trainer_grouped", *plan.arms[2:])
    if ns.unpacked:
        plan.arms = (*plan.arms, "costlab_unpacked")
    costlab, dynamic_why = costlab_configs(plan)
    trainer, flags_used = trainer_flags(plan)
    b = Bench(
        plan=plan,
        costlab=costlab,
        trainer=trainer,
        flags_used=flags_used,
        dynamic_why=dynamic_why,
        rounds_planned=rounds,
        started=started,
    )
    print(
        f"device profile: {profile.device_label} ({profile.cpu_model}), class "
        f"{profile.device_class}; best dtype {plan.best}; "
        + ", ".join(
            f"{name} {r.gflops:.0f} GFLOP/s" for name, r in profile.dtypes.items() if r.gflops
        ),
        flush=True,
    )
    stopper.on_timeout = lambda: emit(b, interrupted=True, human=False)

    def arm(name: str) -> dict[str, Any]:
        if name.startswith("costlab"):
            return run_costlab(plan, name, costlab[name], stopper)
        return run_trainer(plan, name, trainer[name], stopper, attention=attention_of(name))

    def attention_of(name: str) -> str | None:
        return plan.trainer_attention if name in ("trainer_best", "trainer_grouped") else None

    def fits(seconds: float) -> bool:
        return deadline is None or time.perf_counter() + seconds <= deadline

    try:
        b.phase = "warm-up"
        model = load_hf(plan.checkpoint, dev)
        b.eval_init = eval_loss(model, plan.held, plan.pad_id, dev)
        del model
        b.phase = "trainer attention probe"
        flags_used["attn_implementation"] = choose_trainer_attention(
            plan, stopper, trainer["trainer_best"]
        )
        if "torch_compile" in trainer["trainer_best"]:  # a TrainingArguments field here
            flags_used["torch_compile"] = trainer_compile(plan, flags_used["attn_implementation"])
            for name in ("trainer_best", "trainer_grouped"):
                if name in trainer:
                    trainer[name]["torch_compile"] = flags_used["torch_compile"]["value"]
        for name in plan.arms:  # first calls (imports, allocator, caches) before any timing
            if name.startswith("costlab"):
                run_costlab(plan, name, costlab[name], stopper, steps=3, evaluate=False)
            else:
                run_trainer(
                    plan,
                    name,
                    trainer[name],
                    stopper,
                    target_tokens=10**12,
                    max_steps=3,
                    evaluate=False,
                    attention=attention_of(name),
                )
        round_s: list[float] = []
        for r in range(rounds):
            b.phase = f"round {r + 1} of {rounds}"
            if round_s and not fits(round_s[-1]):
                plan.notes.append(
                    f"--budget-s {ns.budget_s:.0f}: stopped after {len(b.per_round)} of {rounds} "
                    f"rounds (a round takes ~{round_s[-1]:.0f} s)"
                )
                break
            began = time.perf_counter()
            k = r % len(plan.arms)
            order = list(plan.arms[k:] + plan.arms[:k])
            b.per_round.append({name: arm(name) for name in order})
            round_s.append(time.perf_counter() - began)
        ratio = summarize(b, False)["ratio"]
        if ns.smoke or ns.breakdown or (ratio is not None and ratio > TARGET):
            b.phase = "operator breakdown"
            per_step = statistics.median(round_s) / len(plan.arms) / max(plan.costlab_steps, 1)
            if fits(per_step * 3 * (BREAKDOWN_STEPS + 3) * 4):
                window = (2, 2 if ns.smoke else BREAKDOWN_STEPS)
                steps = window[0] + window[1] + 1
                b.breakdown = {
                    "trainer_best": run_trainer(
                        plan,
                        "trainer_best",
                        trainer["trainer_best"],
                        stopper,
                        target_tokens=10**12,
                        max_steps=steps,
                        profile_steps=window,
                        evaluate=False,
                        attention=plan.trainer_attention,
                    ).get("ops"),
                    "costlab_optimized": run_costlab(
                        plan,
                        "costlab_optimized",
                        costlab["costlab_optimized"],
                        stopper,
                        steps=steps,
                        profile_steps=window,
                        evaluate=False,
                    ).get("ops"),
                }
            else:
                plan.notes.append(f"--budget-s {ns.budget_s:.0f}: no operator breakdown")
    except Interrupted:
        b.interrupted_during = b.phase
    rc = emit(b, interrupted=b.interrupted_during is not None)
    stopper.done.set()
    shutil.rmtree(plan.workdir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
