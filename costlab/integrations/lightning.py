"""Lightning reporting to costlab in one line:

    trainer = L.Trainer(..., callbacks=[CostlabCallback(experiment=12, arm="bf16")])

The run starts at train start on every process (each rank streams its own device; they share one
run, rank 0's run key broadcast to the others), or is one started before and handed over
(``CostlabCallback(run=costlab.track(...).start())``: adopted, one sampler). It takes each
optimizer step's loss, step time and trained tokens from ``on_train_batch_end`` (``costlab.tokens``:
labels not -100 after the causal shift, an ``(inputs, targets)`` pair's targets, else the
attention mask or ids less each row's first; or ``tokens=fn(batch)``), sends what the module
logs (``trainer.logged_metrics`` every ``log_every_n_steps``, and the validation's) as the run's
metrics by step and its ``hparams`` with the Trainer's settings as hyperparameters, reports each
validation during fit as held-out quality (``val_loss`` from ``trainer.callback_metrics`` as the
run's ``eval_loss``, or the key given as ``eval_loss=``; a named metric with ``quality_metric=``
and ``quality_direction=``; the sanity check skipped), and ends ``succeeded`` at train end,
``failed`` on an exception, ``cancelled`` on Ctrl-C (``on_exception``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback

from costlab.exits import outcome_of
from costlab.integrations import (
    EvalReporter,
    numeric_logs,
    run_opened,
    which_run_checked,
)
from costlab.run import Run
from costlab.tokens import trained_tokens


class CostlabCallback(Callback):
    """experiment, arm (a name or id) or assign=True, run_key: as ``costlab.track``; or run: a
    started ``costlab.Run`` to adopt (then none of those). tokens: a function of a batch giving
    its trained tokens (default ``costlab.trained_tokens``). eval_loss: the key of
    ``trainer.callback_metrics`` reported as the held-out loss after each validation (default
    ``val_loss``; None: none); quality_metric, quality_direction ('lower' or 'higher' is better):
    a named metric reported too, under its key. The other keywords are ``costlab.Run``'s.
    COSTLAB_URL / COSTLAB_TOKEN unless url= / token=."""

    def __init__(
        self,
        experiment: int | None = None,
        arm: str | int | None = None,
        *,
        run: Run | None = None,
        assign: bool = False,
        run_key: str | None = None,
        tokens: Callable[[Any], Any] | None = None,
        eval_loss: str | None = "val_loss",
        quality_metric: str | None = None,
        quality_direction: str | None = None,
        **options: Any,
    ):
        which_run_checked(run, experiment, arm, assign, run_key, options)
        self.experiment, self.arm_given, self.assign, self.run_key = (
            experiment,
            arm,
            assign,
            run_key,
        )
        self.tokens_of = tokens or trained_tokens
        self.evals = EvalReporter(
            eval_loss=eval_loss, quality_metric=quality_metric, quality_direction=quality_direction
        )
        self.options = options
        self.run: Run | None = run
        self.adopted = run is not None
        self._training = False
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
        state["adopted"] = False
        return state

    def on_train_start(self, trainer, pl_module) -> None:
        if self._training and self.run is not None and not self.run.closed:
            self.run.close("failed", "a new fit began before this one ended")
        self._training = False
        run = run_opened(
            self,
            world=int(trainer.world_size),
            rank=int(trainer.global_rank),
            local_rank=int(trainer.local_rank),
            device=str(pl_module.device),
            broadcast=lambda value: trainer.strategy.broadcast(value, src=0),
            barrier=trainer.strategy.barrier,
            what="fit",
        )
        if run is None:
            return
        self._training = True
        self._pending, self._last_step = 0, trainer.global_step
        self.run.log_params(dict(getattr(pl_module, "hparams", {}) or {}), kind="hyperparameters")
        self.run.log_params(_trainer_settings(trainer), kind="trainer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.run is None or not self._training:
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
        every = max(1, int(getattr(trainer, "log_every_n_steps", 50) or 1))
        if trainer.global_step % every == 0:
            logged = numeric_logs(trainer.logged_metrics)
            if logged:
                self.run.log_metrics(logged, step=trainer.global_step)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validation_began = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        # Here, not at on_validation_epoch_end: the epoch's logged values reach callback_metrics
        # after that hook.
        began, self._validation_began = self._validation_began, None
        if self.run is None or self.run.closed or trainer.sanity_checking:
            return
        validation = {k: v for k, v in numeric_logs(trainer.callback_metrics).items() if "val" in k}
        if validation:
            self.run.log_metrics(validation, step=trainer.global_step)
        self.evals.report(
            self.run,
            trainer.callback_metrics,
            eval_s=None if began is None else time.perf_counter() - began,
            step=trainer.global_step,
        )

    def on_train_end(self, trainer, pl_module) -> None:
        self._training = False
        if self.run is not None:
            self.run.close("succeeded")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.run is not None:
            self.run.close(*outcome_of(exception))


def _trainer_settings(trainer: Any) -> dict[str, Any]:
    """The Lightning Trainer's settings that shape the training (its constructor's arguments are
    not kept on it: these are read back)."""
    settings = {
        "max_steps": getattr(trainer, "max_steps", None),
        "max_epochs": getattr(trainer, "max_epochs", None),
        "accumulate_grad_batches": getattr(trainer, "accumulate_grad_batches", None),
        "gradient_clip_val": getattr(trainer, "gradient_clip_val", None),
        "precision": str(getattr(trainer, "precision", "")),
        "world_size": getattr(trainer, "world_size", None),
        "num_nodes": getattr(trainer, "num_nodes", None),
        "strategy": type(getattr(trainer, "strategy", None)).__name__,
    }
    return {k: v for k, v in settings.items() if v is not None}
