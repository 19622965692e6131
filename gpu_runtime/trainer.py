"""The training loop: gradient accumulation to the global batch, one optimizer step per batch.

The hot path does training and nothing else: per step it takes four timestamps,
publishes one ``Progress`` tuple and appends one ``StepWindow``; the sampler thread
does the rest. It checks the cancel callback and the SIGTERM flag before every step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from gpu_runtime.checkpoint import TrainState, save_checkpoint
from gpu_runtime.optim import lr_at, set_lr
from gpu_runtime.precision import Precision
from gpu_runtime.prefetch import Prefetcher
from gpu_runtime.schema import StrategyConfig
from gpu_runtime.telemetry import Progress, RunCounters
from gpu_runtime.timeline import Clock, StepWindow

StopReason = Literal["completed", "cancelled", "interrupted"]


@dataclass
class LoopOutcome:
    status: StopReason
    steps: int  # steps completed in total (a resumed run counts the earlier ones)
    tokens: int
    final_loss: float | None


class Trainer:
    """Owns the model, optimizer and precision policy of one run and steps them."""

    def __init__(self, *, config: StrategyConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                 precision: Precision, device: torch.device, micro_batch: int, dataset_sha256: str,
                 checkpoint_dir: str | None = None):
        self.config, self.model, self.optimizer, self.precision = config, model, optimizer, precision
        self.device, self.micro_batch, self.dataset_sha256 = device, micro_batch, dataset_sha256
        self.checkpoint_dir = checkpoint_dir
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.stepped = self.trainable if precision.masters is None else [m for _, m in precision.masters.named_masters()]

    def train_step(self, step: int, total_steps: int, tokens: torch.Tensor) -> torch.Tensor:
        """One optimizer step on a (global_batch, seq_len + 1) batch; returns the mean loss (a tensor)."""
        set_lr(self.optimizer, lr_at(step, self.config.train, total_steps))
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        rows = tokens.shape[0]
        scaler = self.precision.scaler
        loss_sum = torch.zeros((), device=self.device)
        for start in range(0, rows, self.micro_batch):
            x, y = inputs[start:start + self.micro_batch], targets[start:start + self.micro_batch]
            weight = x.shape[0] / rows  # a short last micro-batch counts for its rows only
            with self.precision.autocast():
                _, loss = self.model(x, y)
            scaler.scale(loss * weight).backward()
            loss_sum += loss.detach() * weight
        if self.precision.masters is not None:
            self.precision.masters.grads_to_masters()
        if self.config.train.grad_clip > 0:
            scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.stepped, self.config.train.grad_clip)
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.precision.masters is not None:
            self.precision.masters.masters_to_model()
        return loss_sum

    def state(self, step: int, tokens: int) -> TrainState:
        masters = self.precision.masters
        return TrainState(step=step, tokens=tokens, model=self.model.state_dict(),
                          optimizer=self.optimizer.state_dict(), scaler=self.precision.scaler.state_dict(),
                          masters=None if masters is None else masters.state(), dataset_sha256=self.dataset_sha256)

    def save(self, step: int, tokens: int) -> None:
        if self.checkpoint_dir is not None:
            save_checkpoint(self.checkpoint_dir, self.config, self.state(step, tokens))

    def run(self, *, prefetcher: Prefetcher, start_step: int, total_steps: int, start_tokens: int,
            counters: RunCounters, clock: Clock, windows: deque[StepWindow],
            cancel: Callable[[], bool] | None, stop: threading.Event,
            before_step: Callable[[], None] | None = None) -> LoopOutcome:
        """Train from ``start_step`` to ``total_steps`` unless cancelled or stopped; then checkpoint.

        ``before_step`` runs at every step boundary (live strategy updates come in there).
        """
        tokens_per_step = self.config.train.global_batch * self.config.model.seq_len
        every = self.config.train.checkpoint_every
        step, tokens, loss_value = start_step, start_tokens, None
        time_total, timed = 0.0, 0
        status: StopReason = "completed"
        self.model.train()
        while step < total_steps:
            if stop.is_set():
                status = "interrupted"
                break
            if cancel is not None and cancel():
                status = "cancelled"
                break
            if before_step is not None:
                before_step()
            t0 = time.perf_counter()
            batch = prefetcher.next()
            compute_start = clock.stamp()
            loss = self.train_step(step, total_steps, batch.tokens)
            compute_end = clock.stamp()
            loss_value = loss.item()  # the one host sync per step
            step, tokens = step + 1, tokens + tokens_per_step
            time_total, timed = time_total + (time.perf_counter() - t0), timed + 1
            windows.append(StepWindow(step, compute_start, compute_end, batch.io_start, batch.io_end))
            counters.progress = Progress(step, tokens, time_total, timed, loss_value, self.micro_batch)
            if every and step % every == 0 and step < total_steps:
                self.save(step, tokens)
        self.save(step, tokens)
        return LoopOutcome(status=status, steps=step, tokens=tokens, final_loss=loss_value)
