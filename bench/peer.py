"""The peer benchmark: costlab against `transformers.Trainer`, same model, data, tokens and machine.

    python bench/peer.py [--quick] [--json] [--smoke] [--device cpu|cuda] [--rounds N]
                         [--tokens N] [--trainer-batch N] [--price-per-hour USD] [--budget-s S]
                         [--breakdown] [--unpacked] [--threads N] [--clock auto|wall|cpu]

A team that does not use costlab fine-tunes its checkpoint with `transformers.Trainer`. This bench
trains the same checkpoint on the same records both ways, in one process, and compares what a
trained token costs and how good the model is after the same number of trained tokens.

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
  native (`best_dtype(profile) == "bf16"`), gradient checkpointing off, the group-by-length
  sampler (`train_sampling_strategy="group_by_length"`, transformers 5's spelling of
  `group_by_length=True`: its answer to padding waste), `dataloader_num_workers=0`, fused AdamW
  (`optim="adamw_torch_fused"`), no torch.compile on a CPU, and the model's
  `attn_implementation` (sdpa or eager) that trains faster here, measured before the warm-up on
  short trainer_best runs (`choose_trainer_attention`; on an AVX-512 EPYC eager wins by ~1.3x).
* costlab_default: `gpu_runtime.train` with the default strategy for this model and data: family
  hf, init checkpoint, full fine-tune saved, jsonl alpaca, packing (the default), loss on all
  tokens, fp32.
* costlab_optimized: what costlab recommends on this device: `precision.compute_dtype: auto`
  (resolved from the profile), packing, `kernels.fused_optimizer`, `kernels.fused_rmsnorm_qkv`
  (a llama checkpoint trains as costlab's own Transformer), prefetch, `kernels.compile: auto`
  (off on a CPU), `kernels.attention: auto` (math on a CPU); not dynamic batching, which has
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
  loss: mean next-token cross-entropy in fp32 over every token of them but each record's first.
  costlab's model is read back from the weights it saved (`finetune.save: true`) with
  `AutoModelForCausalLM.from_pretrained`.

Headline: `ratio` = costlab_optimized's cost per trained token / trainer_best's (median over
rounds, with min and max); target <= 0.8 with costlab_optimized's eval loss at most 2 % above
trainer_best's (`loss_within_2pct`). `ratios` has every costlab arm over every Trainer arm.
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

`--quick`: 2 rounds of 28,672 trained tokens per arm (56 costlab steps), about 4 minutes on a
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
from arms import ASSUMED_PRICE, usd_per_million  # noqa: E402  (bench/arms.py: one price table)

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
TRAINER_ARMS = ("trainer_default", "trainer_best")
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
    """Mean next-token cross-entropy (fp32) over every held-out token but each record's first."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(held), 8):
            rows = held[i : i + 8]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, r in enumerate(rows):
                ids[j, : len(r)] = torch.tensor(r)
                mask[j, : len(r)] = 1
            ids, mask = ids.to(device), mask.to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            total += torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)),
                targets.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            ).item()
            count += int((targets != -100).sum())
    return total / count


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

    def mark(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        index = len(self.wall)
        now_wall, now_cpu = time.perf_counter(), time.process_time()
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
                self.window = {"wall": time.perf_counter(), "cpu": time.process_time()}
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
            "group_by_length",
            "Trainer's answer to padding waste: batches of records of similar length "
            "(transformers 5 spells group_by_length=True this way)",
        ),
        "dataloader_num_workers": (
            0,
            "tokenized records in memory: collating in worker processes only adds IPC",
        ),
        "optim": ("adamw_torch_fused", "one fused kernel per parameter group (CPU and CUDA)"),
        "torch_compile": (
            plan.dev.type == "cuda",
            "on: a CUDA device"
            if plan.dev.type == "cuda"
            else "off on a CPU, as costlab's kernels.compile auto (neither side compiles here): "
            "a first compile takes 20-85 s on a 2-core CPU; compiled, both sides run ~1.2-1.3x "
            "faster (docs/benchmarks.md)",
        ),
    }
    if "train_sampling_strategy" not in fields and "group_by_length" in fields:
        wanted["group_by_length"] = (True, wanted.pop("train_sampling_strategy")[1])
    best: dict[str, Any] = {}
    used: dict[str, dict[str, Any]] = {}
    for name, (value, why) in wanted.items():
        if name in fields:
            best[name] = value
            used[name] = {"value": value, "why": why}
        else:
            used[name] = {"value": None, "why": f"not a TrainingArguments field here: {why}"}
    return {"trainer_default": {}, "trainer_best": best}, used


TRAINER_ATTENTION_PROBE_STEPS = 12  # steps per probe run; two runs of each implementation


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

        def on_step_end(self, args, state, control, **kw):
            t["end"] = time.process_time()
            steps.append(collator.pending.popleft())
            if len(steps) >= 2:  # the first step is warm-up
                split["fwd_bwd"] += t["pre"] - t["begin"]
                split["optimizer"] += t["opt"] - t["pre"]
            # stop at the step nearest the target: within half a step of it, or past it
            if sum(s[0] for s in steps) + half_step >= target or (
                stopper is not None and stopper.stopped
            ):
                control.should_training_stop = True

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

    def cancel() -> bool:
        clock.mark()
        return stopper is not None and stopper.stopped

    try:
        with PeakMemory(plan.dev) as memory:
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
    ratios = {f"{c}/{t}": ratio_of(c, t) for c in ours_arms for t in TRAINER_ARMS}
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
        if name in TRAINER_ARMS:
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
    label = device_label(plan.dev)
    return {
        "ratio": ratio,
        "ratio_spread": None if head is None else {k: head[k] for k in ("median", "min", "max")},
        "ratio_per_round": None if head is None else head["per_round"],
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
        f"{'peak MiB':>9} {'eval loss':>10} {'padding':>8} {'step s':>7}"
    )
    for name, a in f["arms"].items():
        w = f["where_time_goes"][name]
        loss = "-" if a["eval_loss"] is None else f"{a['eval_loss']:.4f}"
        print(
            f"{name:<18} {a['trained_tokens_per_s']:>13.1f} {a['trained_tokens_per_s_wall']:>8.1f} "
            f"{a['usd_per_1m_trained_tokens']:>15.4f} {a['peak_mem_mb']:>9.1f} {loss:>10} "
            f"{w['padding_share']:>8.1%} {w['step_s']:>7.3f}"
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
    if ns.unpacked:
        plan.arms = (*ARMS, "costlab_unpacked")
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
        return plan.trainer_attention if name == "trainer_best" else None

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
