"""Lightning reporting to costlab in one line:

    trainer = L.Trainer(..., callbacks=[CostlabCallback(experiment=12, arm="bf16")])

The run starts at train start on every process (each rank streams its own device; they share one
run, rank 0's run key broadcast to the others), takes each optimizer step's loss, step time and
tokens from ``on_train_batch_end`` (counted from the batch: the attention mask's sum, else the
input ids, else an integer tensor's size; or ``tokens=fn(batch)``), reports each validation
during fit as held-out quality (``val_loss`` from ``trainer.callback_metrics`` as the run's
``eval_loss``, or the key given as ``eval_loss=``; a named metric with ``quality_metric=`` and
``quality_direction=``; the sanity check skipped), and ends ``succeeded`` at train end,
``failed`` on an exception, ``cancelled`` on Ctrl-C (``on_exception``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback

from costlab.exits import outcome_of
from costlab.integrations import EvalReporter, shared_run_key, tokens_in
from costlab.run import Run


class CostlabCallback(Callback):
    """experiment, arm (a name or id) or assign=True, run_key: as ``costlab.track``; tokens: a
    function of a batch giving its tokens (default: counted as above). eval_loss: the key of
    ``trainer.callback_metrics`` reported as the held-out loss after each validation (default
    ``val_loss``; None: none); quality_metric, quality_direction ('lower' or 'higher' is better):
    a named metric reported too, under its key. The other keywords are ``costlab.Run``'s.
    COSTLAB_URL / COSTLAB_TOKEN unless url= / token=."""

    def __init__(
        self,
        experiment: int,
        arm: str | int | None = None,
        *,
        assign: bool = False,
        run_key: str | None = None,
        tokens: Callable[[Any], Any] | None = None,
        eval_loss: str | None = "val_loss",
        quality_metric: str | None = None,
        quality_direction: str | None = None,
        **options: Any,
    ):
        self.experiment, self.arm_given, self.assign, self.run_key = (
            experiment,
            arm,
            assign,
            run_key,
        )
        self.tokens_of = tokens or tokens_in
        self.evals = EvalReporter(
            eval_loss=eval_loss, quality_metric=quality_metric, quality_direction=quality_direction
        )
        self.options = options
        self.run: Run | None = None
        self._pending: Any = 0
        self._last_step = 0
        self._validation_began: float | None = None

    @property
    def run_id(self) -> int | None:
        return None if self.run is None else self.run.run_id

    def __getstate__(self) -> dict:
        """A copy (a spawned process's, a deepcopy) starts its own run: threads do not travel."""
        state = self.__dict__.copy()
        state["run"] = None
        return state

    def on_train_start(self, trainer, pl_module) -> None:
        if self.run is not None and not self.run.closed:
            self.run.close("failed", "a new fit began before this one ended")
        world, rank = int(trainer.world_size), int(trainer.global_rank)
        key = shared_run_key(
            self.run_key,
            world_size=world,
            rank=rank,
            broadcast=lambda value: trainer.strategy.broadcast(value, src=0),
        )
        self.run = Run(
            self.experiment,
            self.arm_given,
            assign=self.assign,
            run_key=key,
            rank=rank,
            local_rank=int(trainer.local_rank),
            world_size=world,
            device=str(pl_module.device),
            barrier=trainer.strategy.barrier if world > 1 else None,
            **self.options,
        ).start()
        self._pending, self._last_step = 0, trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.run is None:
            return
        tokens = self.tokens_of(batch)
        if tokens is not None:
            self._pending = self._pending + tokens
        if trainer.global_step == self._last_step:
            return  # accumulating gradients: the optimizer step has not happened yet
        self._last_step = trainer.global_step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            loss = loss.detach()
        tokens, self._pending = self._pending, 0
        self.run.log(step=trainer.global_step, tokens=tokens, loss=loss)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validation_began = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        # Here, not at on_validation_epoch_end: the epoch's logged values reach callback_metrics
        # after that hook.
        began, self._validation_began = self._validation_began, None
        if self.run is None or self.run.closed or trainer.sanity_checking:
            return
        self.evals.report(
            self.run,
            trainer.callback_metrics,
            eval_s=None if began is None else time.perf_counter() - began,
            step=trainer.global_step,
        )

    def on_train_end(self, trainer, pl_module) -> None:
        if self.run is not None:
            self.run.close("succeeded")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.run is not None:
            self.run.close(*outcome_of(exception))
