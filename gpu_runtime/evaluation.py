"""Held-out evaluation (``eval:``): the loss on records never trained on, every ``every_steps``
optimizer steps and once at the end of a completed run.

What is evaluated: the held-out corpus (``gpu_runtime.data.load_split_corpus``) in a fixed order
(its records by hash), cut as training reads it: a packed stream (text, synthetic) in consecutive
windows of seq_len + 1 tokens that share one token, so every held-out token but the first is a
target once; records (jsonl, unpacked text) one per row, truncated to seq_len + 1 as a row
truncates them. The first ``max_tokens`` targets that train (not padding, not a prompt under
``loss_on: response``, not a row's first token) are kept, the rest dropped, so every run with the
same data and keys evaluates the same tokens.

The loss: the mean next-token cross-entropy over those targets, the logits taken in fp32 (the
forward runs as training's does, under the strategy's autocast), summed in fp64 over the rows. The
model evaluates under ``torch.no_grad`` in ``eval()`` mode (LoRA dropout off), then trains again.
It is the plain module, never the torch.compile or DDP wrapper.

DDP: every rank evaluates its share of the rows (row batches dealt round-robin) and one all-reduce
sums the loss and the count, so each rank has the world's loss and the ranks stay in step; rank 0
alone emits the evaluation's sample.

Its time: the trainer runs an evaluation between two steps, with the sampler held (no sample in
the middle of one). Its wall seconds are in the run's wall time and energy (billed), in the
sample it emits (``eval_s``) and in the RunResult (``eval_s``), and never in a step's time or
tokens/s (``Progress.eval_s``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpu_runtime.data import Corpus, split_batch
from gpu_runtime.errors import StrategyError
from gpu_runtime.holdout import KEY as HOLDOUT_KEY
from gpu_runtime.model import IGNORE_INDEX
from gpu_runtime.telemetry import RunCounters, Sampler
from gpu_runtime.world import World

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets): split_batch of marked rows


def held_out_rows(corpus: Corpus, *, seq_len: int, max_tokens: int) -> list[torch.Tensor]:
    """The held-out corpus as rows of at most seq_len + 1 marked tokens, in a fixed order, holding
    its first ``max_tokens`` targets that train (all of them when it has fewer)."""
    tokens = corpus.tokens.long()
    width = seq_len + 1
    if corpus.records is None:
        pieces = (tokens[start : start + width] for start in range(0, tokens.numel() - 1, seq_len))
    else:
        bounds = corpus.records.tolist()
        pieces = (tokens[a : min(b, a + width)] for a, b in zip(bounds, bounds[1:], strict=False))
    rows, budget = [], max_tokens
    for piece in pieces:
        trained = piece[1:] >= 0
        count = int(trained.sum())
        if count == 0:
            continue
        if count >= budget:
            last = int(trained.nonzero()[budget - 1])  # the budget-th target is piece[last + 1]
            rows.append(piece[: last + 2])
            break
        rows.append(piece)
        budget -= count
    if not rows:
        raise StrategyError.single(
            HOLDOUT_KEY,
            "the held-out records have no target to evaluate (each is one token, or only prompt)",
        )
    return rows


def row_batches(rows: list[torch.Tensor], *, rows_per_batch: int, pad_id: int) -> list[Batch]:
    """Rows in batches of ``rows_per_batch``, each padded to its longest row with ``~pad_id``
    (never a target), as (inputs, targets)."""
    batches = []
    for start in range(0, len(rows), rows_per_batch):
        group = rows[start : start + rows_per_batch]
        longest = max(r.numel() for r in group)
        padded = torch.full((len(group), longest), ~pad_id, dtype=torch.long)
        for i, row in enumerate(group):
            padded[i, : row.numel()] = row
        batches.append(split_batch(padded))
    return batches


@contextlib.contextmanager
def _evaluating(model: nn.Module):
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def held_out_loss(
    model: nn.Module,
    batches: list[Batch],
    *,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    world: World | None = None,
    device: torch.device | None = None,
) -> float:
    """Mean next-token cross-entropy (fp32 logits, an fp64 sum) over the batches' targets that
    are not IGNORE_INDEX; with ``world``, over every rank's batches (each passes its own)."""
    if device is None:
        device = batches[0][0].device if batches else torch.device("cpu")
    total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, targets
    with _evaluating(model):
        for inputs, targets in batches:
            with autocast():
                logits, _ = model(inputs)
            flat = targets.reshape(-1)
            total[0] += F.cross_entropy(
                logits.float().reshape(-1, logits.size(-1)),
                flat,
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
            total[1] += (flat != IGNORE_INDEX).sum()
    if world is not None:
        total = world.total(total)
    loss_sum, count = total.tolist()  # the one host sync
    return loss_sum / count if count else float("nan")


class Evaluation:
    """A run's held-out evaluations: when they are due, running one, what they measured."""

    def __init__(
        self,
        *,
        model: nn.Module,
        batches: list[Batch],
        every_steps: int | None,
        autocast: Callable[[], contextlib.AbstractContextManager],
        device: torch.device,
        world: World | None = None,
        sampler: Sampler | None = None,
        report: dict[str, Any] | None = None,
    ):
        self.model, self.every_steps, self.autocast = model, every_steps, autocast
        self.device, self.world, self.sampler = device, world, sampler
        # a DDP rank evaluates its share of the batches; an all-reduce adds the others'
        self.batches = batches if world is None else batches[world.rank :: world.world_size]
        self.report = report or {}
        self.seconds = 0.0  # every evaluation's wall seconds, summed
        self.loss: float | None = None  # the last one's
        self.history: list[dict[str, Any]] = []  # {step, tokens, eval_loss, eval_s} each

    def due(self, step: int, total_steps: int) -> bool:
        """An evaluation after this step (the run's last step evaluates in ``finish``)."""
        every = self.every_steps
        return every is not None and step % every == 0 and step < total_steps

    def run(self, step: int, counters: RunCounters) -> float:
        """Evaluate now, between two steps; emit the sample that carries it (rank 0)."""
        held = self.sampler.held() if self.sampler is not None else contextlib.nullcontext()
        with held as emit:
            started = time.perf_counter()
            loss = held_out_loss(
                self.model,
                self.batches,
                autocast=self.autocast,
                world=self.world,
                device=self.device,
            )
            seconds = time.perf_counter() - started
            progress = counters.progress
            counters.progress = progress._replace(eval_s=progress.eval_s + seconds)
            self.seconds += seconds
            self.loss = loss
            self.history.append(
                {"step": step, "tokens": progress.tokens, "eval_loss": loss, "eval_s": seconds}
            )
            if emit is not None and (self.world is None or self.world.lead):
                emit({"eval_loss": loss, "eval_s": seconds})
        return loss


def build_evaluation(
    held_out: Corpus,
    *,
    seq_len: int,
    max_tokens: int,
    rows_per_batch: int,
    every_steps: int | None,
    model: nn.Module,
    autocast: Callable[[], contextlib.AbstractContextManager],
    device: torch.device,
    world: World | None = None,
    sampler: Sampler | None = None,
    report: dict[str, Any] | None = None,
) -> Evaluation:
    """The evaluation of a held-out corpus: its rows cut once, moved to the device once."""
    rows = held_out_rows(held_out, seq_len=seq_len, max_tokens=max_tokens)
    batches = [
        (x.to(device), y.to(device))
        for x, y in row_batches(rows, rows_per_batch=rows_per_batch, pad_id=held_out.pad_id)
    ]
    targets = sum(int((y != IGNORE_INDEX).sum()) for _, y in batches)
    return Evaluation(
        model=model,
        batches=batches,
        every_steps=every_steps,
        autocast=autocast,
        device=device,
        world=world,
        sampler=sampler,
        report={
            **(report or {}),
            "every_steps": every_steps,
            "max_tokens": max_tokens,
            "targets": targets,
            "rows": len(rows),
            "rows_per_batch": rows_per_batch,
            "sha256": held_out.sha256,
        },
    )
