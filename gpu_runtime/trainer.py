"""The training loop: gradient accumulation to the global batch, one optimizer step per batch.

The hot path does training and nothing else: per step it takes four timestamps,
makes one host sync (the loss, and with dynamic batching the two gradient norms in the
same transfer), publishes one ``Progress`` tuple and appends one ``StepWindow``; the
sampler thread does the rest. The micro-batches come from ``MicroBatching`` (fixed, or
the BatchScaler's). It checks the cancel callback and the SIGTERM flag before every step.
A held-out evaluation (``eval:``) runs between two steps, outside any step's timing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn

from gpu_runtime.batching import MicroBatching
from gpu_runtime.checkpoint import TrainState, save_checkpoint
from gpu_runtime.data import split_batch
from gpu_runtime.evaluation import Evaluation
from gpu_runtime.optim import lr_at, set_lr
from gpu_runtime.precision import Precision
from gpu_runtime.prefetch import Prefetcher
from gpu_runtime.schema import StrategyConfig
from gpu_runtime.strategies.accumulation import AccumulationPlan
from gpu_runtime.telemetry import Progress, RunCounters
from gpu_runtime.timeline import Clock, StepWindow
from gpu_runtime.world import World

StopReason = Literal["completed", "cancelled", "interrupted"]


@dataclass
class StepOutput:
    loss: torch.Tensor  # the step's mean loss, on the device
    plan: AccumulationPlan  # the micro-batches the step ran (after any out-of-memory retry)
    norms: torch.Tensor | None  # dynamic batching's two squared gradient norms, on the device
    # targets trained on (padding and prompts masked out), on the device; None: every target
    trained: torch.Tensor | None = None

    def read(self) -> tuple[float, list[float] | None, float | None]:
        """Loss, norms and the trained-target count in one device-to-host transfer."""
        parts = [self.loss.reshape(1).float()]
        if self.norms is not None:
            parts.append(self.norms.to(self.loss.device).float())
        if self.trained is not None:
            parts.append(self.trained.reshape(1).to(self.loss.device).float())
        if len(parts) == 1:
            return self.loss.item(), None, None
        values = torch.cat(parts).tolist()
        trained = values.pop() if self.trained is not None else None
        return values[0], (values[1:] or None) if self.norms is not None else None, trained


@dataclass
class LoopOutcome:
    status: StopReason
    steps: int  # steps completed in total (a resumed run counts the earlier ones)
    tokens: int
    final_loss: float | None


def _loss_scale(scaler: torch.amp.GradScaler) -> torch.Tensor | None:
    """The GradScaler's scale as a device tensor (``get_scale()`` would sync); None when off.

    Read by operations queued before ``scaler.update()``, so they see this step's scale.
    """
    if not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)
    return scale if isinstance(scale, torch.Tensor) else None


class FaultHook(Protocol):
    def check(self, micro_batch: int) -> None: ...


class Trainer:
    """Owns the model, optimizer, precision policy and micro-batch policy of one run and steps
    them."""

    # Test hook: an object whose check(micro_batch_rows) may raise an out-of-memory error
    # before a micro-batch's forward (the tests' tests.gpu_runtime.faults.SimulatedOom).
    fault: FaultHook | None = None
    # kernels.compile's controller (gpu_runtime.kernels.compiling): told of each step until it
    # goes quiet; it switches ``forward`` between the module and its compiled wrapper
    compiling = None
    # dynamic batching and compile: the first compiled micro-batch's batch dimension is marked
    # dynamic, so every micro-batch size the scaler tries runs the one graph
    mark_batch_dynamic = False

    def __init__(
        self,
        *,
        config: StrategyConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: Precision,
        device: torch.device,
        batching: MicroBatching,
        dataset_sha256: str,
        checkpoint_dir: str | None = None,
        forward: nn.Module | None = None,
        world: World | None = None,
        count_trained: bool = False,
    ):
        self.config, self.model, self.optimizer, self.precision = (
            config,
            model,
            optimizer,
            precision,
        )
        self.world = world  # a DDP rank: `forward` is the DistributedDataParallel wrapper
        self.device, self.batching, self.dataset_sha256 = device, batching, dataset_sha256
        self.forward = (
            model if forward is None else forward
        )  # a torch.compile wrapper when kernels.compile
        self.checkpoint_dir = checkpoint_dir
        # the data masks targets (padding, prompts): count the tokens trained on, not the rows'
        self.count_trained = count_trained
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        stepped = (
            self.trainable
            if precision.masters is None
            else [m for _, m in precision.masters.named_masters()]
        )
        # device tensors first: a norm over several devices is gathered on the first one's
        self.stepped = sorted(stepped, key=lambda p: p.device.type == "cpu")

    @property
    def micro_batch(self) -> int:
        return self.batching.plan.micro_batch

    def apply_config(self, config: StrategyConfig) -> None:
        """Take a live update at a step boundary (the micro-batch bounds reach the scaler here)."""
        self.config = config
        self.batching.reconfigure(config.optimizer.dynamic_batching)

    def _accumulate(
        self, plan: AccumulationPlan, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        scaler = self.precision.scaler
        loss_sum = torch.zeros((), device=self.device)
        # Masked targets (prompts, padding): each micro-batch's mean loss counts for its share of
        # the step's trained targets, so the step's loss is the mean over every trained target
        # however the rows were split (device tensors: no host sync).
        step_trained = (
            (targets[: plan.global_batch] >= 0).sum().clamp(min=1) if self.count_trained else None
        )
        start = 0
        for index, rows in enumerate(plan.micro_batch_sizes):
            if self.fault is not None:
                self.fault.check(rows)
            x, y = inputs[start : start + rows], targets[start : start + rows]
            start += rows
            if self.mark_batch_dynamic:  # until the first compile: one graph for every micro-batch
                torch._dynamo.maybe_mark_dynamic(x, 0)
                torch._dynamo.maybe_mark_dynamic(y, 0)
            # a short last micro-batch counts for its rows only
            weight = (
                plan.loss_weight(index) if step_trained is None else (y >= 0).sum() / step_trained
            )
            with self._sync(last=index == len(plan.micro_batch_sizes) - 1):
                with self.precision.autocast():
                    _, loss = self.forward(x, y)
                scaler.scale(loss * weight).backward()
            self.batching.after_micro_batch(plan, index)
            loss_sum += loss.detach() * weight
        return loss_sum

    def _compile_failed(self, exc: Exception) -> bool:
        """A compile error in a single-process run: eager from this step on (True: run it
        again). A DDP rank's compile error fails the run: its ranks must train alike."""
        from gpu_runtime.kernels.compiling import is_compile_error

        if self.compiling is None or not self.compiling.compiled_now or self.world is not None:
            return False
        if not is_compile_error(exc):
            return False
        self._drop_grads()
        self.compiling.failed(exc)
        return True

    def _sync(self, *, last: bool) -> contextlib.AbstractContextManager:
        """DDP all-reduces the gradients in the last micro-step's backward only (``no_sync`` before
        it)."""
        if self.world is None or last:
            return contextlib.nullcontext()
        return self.forward.no_sync()

    def _drop_grads(self) -> None:
        """What a step that ran out of memory half way leaves behind."""
        for p in self.trainable:
            p.grad = None

    def train_step(self, step: int, total_steps: int, tokens: torch.Tensor) -> StepOutput:
        """One optimizer step on a (global_batch, seq_len + 1) batch; the loss stays on the
        device."""
        # adaptive_global_batch scales the LR with the batch it chose (1.0 otherwise)
        set_lr(self.optimizer, lr_at(step, self.config.train, total_steps) * self.batching.lr_scale)
        inputs, targets = split_batch(tokens)
        loss_sum, plan = self.batching.run(
            lambda p: self._accumulate(p, inputs, targets), cleanup=self._drop_grads
        )
        trained = (targets[: plan.global_batch] >= 0).sum() if self.count_trained else None
        if self.world is not None:
            loss_sum = self.world.mean(
                loss_sum
            )  # the world's loss, as one process over the global batch
            if trained is not None:  # the world's count: its mean over ranks, times the ranks
                trained = self.world.mean(trained.float()) * self.world.world_size
        scaler = self.precision.scaler
        norms = self.batching.pending_norms(loss_scale=_loss_scale(scaler))
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
        return StepOutput(loss_sum, plan, norms, trained)

    def state(self, step: int, tokens: int) -> TrainState:
        masters = self.precision.masters
        return TrainState(
            step=step,
            tokens=tokens,
            model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(),
            scaler=self.precision.scaler.state_dict(),
            masters=None if masters is None else masters.state(),
            dataset_sha256=self.dataset_sha256,
        )

    def save(self, step: int, tokens: int) -> None:
        if self.checkpoint_dir is not None:
            save_checkpoint(self.checkpoint_dir, self.config, self.state(step, tokens))

    def run(
        self,
        *,
        prefetcher: Prefetcher,
        start_step: int,
        total_steps: int,
        start_tokens: int,
        counters: RunCounters,
        clock: Clock,
        windows: deque[StepWindow],
        cancel: Callable[[], bool] | None,
        stop: threading.Event,
        before_step: Callable[[], None] | None = None,
        agree: Callable[[], None] | None = None,
        evaluation: Evaluation | None = None,
    ) -> LoopOutcome:
        """Train from ``start_step`` to ``total_steps`` unless cancelled or stopped; then
        checkpoint.

        ``before_step`` runs at every step boundary (live strategy updates come in there).
        ``agree`` runs first at every boundary: a DDP rank learns there, with every other
        rank, whether to stop or cancel and which live keys to take. ``evaluation`` runs after
        the steps it is due at and once after the last step of a completed run, after the step's
        time is taken and before the next step's starts.
        """
        every = self.config.train.checkpoint_every
        ranks = (
            1 if self.world is None else self.world.world_size
        )  # each rank trains global_batch / ranks
        step, tokens, loss_value = start_step, start_tokens, None
        time_total, timed = 0.0, 0
        status: StopReason = "completed"
        self.model.train()
        while step < total_steps:
            if agree is not None:
                agree()
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
            try:
                out = self.train_step(step, total_steps, batch.tokens)
            except Exception as exc:
                if not self._compile_failed(exc):
                    raise
                out = self.train_step(step, total_steps, batch.tokens)  # the same step, eager
            compute_end = clock.stamp()
            loss_value, norms, trained = out.read()  # the one host sync per step
            if self.world is None or self.world.lead:
                self.batching.finish_step(norms)
            if (
                self.world is not None and self.batching.enabled
            ):  # rank 0's BatchScaler decides for all
                self.batching.adopt(
                    self.world.broadcast_int(self.batching.plan.micro_batch, self.device)
                )
            step_tokens = (
                out.plan.global_batch * ranks * self.config.model.seq_len
                if trained is None
                else round(trained)
            )
            step, tokens = step + 1, tokens + step_tokens
            elapsed = time.perf_counter() - t0
            time_total, timed = time_total + elapsed, timed + 1
            if self.compiling is not None and self.compiling.active:
                self.compiling.after_step(step, elapsed)
            windows.append(
                StepWindow(step, compute_start, compute_end, batch.io_start, batch.io_end)
            )
            counters.progress = Progress(
                step,
                tokens,
                time_total,
                timed,
                loss_value,
                out.plan.micro_batch,
                counters.progress.eval_s,
            )
            if every and step % every == 0 and step < total_steps:
                self.save(step, tokens)
            if evaluation is not None and evaluation.due(step, total_steps):
                evaluation.run(step, counters)
        if evaluation is not None and status == "completed":
            evaluation.run(step, counters)
        self.save(step, tokens)
        return LoopOutcome(status=status, steps=step, tokens=tokens, final_loss=loss_value)
