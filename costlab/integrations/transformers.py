"""``transformers.Trainer`` reporting to costlab in one line:

    trainer = Trainer(..., callbacks=[CostlabCallback(experiment=12, arm="bf16")])

With an assigned arm, one object assigns, applies the arm's strategy and tracks:

    callback = CostlabCallback(experiment=12, assign=True)
    args = callback.apply(training_args)  # the arm's declared keys; conflicts said, not applied
    Trainer(model, args, train_dataset=data, callbacks=[callback]).train()

A run started elsewhere (``costlab.track(...).start()``) is handed over with ``run=``: the
callback adopts it, so there is one sampler, and ends it at train end.

The run starts at train begin on every process (each rank streams its own device; they share one
run), or at ``apply()``. At each optimizer step it takes the step count and time, the loss of the
step's forwards (read from the model's output, whatever ``logging_steps`` is; the logged ``loss``
where the loss is computed outside the model) and the trained tokens of the step's forwards
(``costlab.tokens``: labels not -100 after the causal shift, whatever the Trainer's
``include_num_input_tokens_seen``; times the world size). Everything the Trainer logs (``loss``,
``grad_norm``, ``learning_rate``, ``train_loss`` at the end, ``eval_*``) goes as the run's metrics
by step; its arguments and the model's config as the run's hyperparameters. Each evaluation
during training (``eval_strategy``) goes as the run's held-out quality: ``eval_loss``, and a
named metric where one is configured (``quality_metric="accuracy", quality_direction="higher"``),
with ``eval_runtime`` as the seconds it took. It ends ``succeeded`` at train end.

The Trainer has no exception event: an exception that ends the process ends the run ``failed``
(``cancelled`` for Ctrl-C) as the process exits. Code that catches it and goes on says so with
the callback as a context manager (``with callback: trainer.train()``), or ``callback.close()``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from costlab.delivery import say
from costlab.evaluation import EVAL_LOSS
from costlab.exits import outcome_of
from costlab.integrations import (
    EvalReporter,
    numeric_logs,
    run_opened,
    which_run_checked,
)
from costlab.run import Run
from costlab.strategy import TrainerArgs, to_trainer_args
from costlab.tokens import trained_tokens


class CostlabCallback(TrainerCallback):
    """experiment, arm (a name or id) or assign=True, run_key: as ``costlab.track``; or run: a
    started ``costlab.Run`` to adopt (then none of those). eval_loss: the key of
    ``on_evaluate``'s metrics reported as the held-out loss (default ``eval_loss``; None: none).
    quality_metric, quality_direction ('lower' or 'higher' is better): a named metric reported
    too, under the name given, found as that key or with the Trainer's ``eval_`` prefix
    (``"accuracy"``: ``eval_accuracy``). The other keywords are ``costlab.Run``'s.
    COSTLAB_URL / COSTLAB_TOKEN unless url= / token=."""

    def __init__(
        self,
        experiment: int | None = None,
        arm: str | int | None = None,
        *,
        run: Run | None = None,
        assign: bool = False,
        run_key: str | None = None,
        eval_loss: str | None = EVAL_LOSS,
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
        self.evals = EvalReporter(
            eval_loss=eval_loss,
            quality_metric=quality_metric,
            quality_direction=quality_direction,
            prefixes=("eval_",),
        )
        self.options = options
        self.run: Run | None = run
        self.adopted = run is not None
        self.mapping: TrainerArgs | None = None  # what apply() applied, left out and refused
        self._training = False
        self._step_tokens: Any = 0
        self._loss_sum: Any = None
        self._loss_parts = 0
        self._loss_share = False  # the model's loss is a share of the step's (num_items_in_batch)
        self._loss_scale = 1
        self._loss_from_model = False
        self._shifted = True
        self._hook = None

    @property
    def run_id(self) -> int | None:
        return None if self.run is None else self.run.run_id

    def __getstate__(self) -> dict:
        """A copy (a spawned process's, a deepcopy) starts its own run: threads do not travel."""
        state = self.__dict__.copy()
        state["run"] = None
        state["_hook"] = None
        state["adopted"] = False
        return state

    # -- the run -------------------------------------------------------------------------------

    def _open_run(self, args) -> Run | None:
        return run_opened(
            self,
            world=int(args.world_size),
            rank=int(args.process_index),
            local_rank=max(0, int(args.local_process_index)),
            device=str(args.device),
            broadcast=_broadcast,
            barrier=_barrier,
            what="train()",
        )

    def apply(self, args: Any) -> Any:
        """Start the run (assigning its arm) and return `args` (TrainingArguments) with the keys
        the arm declares applied (``costlab.to_trainer_args``). A key the script set otherwise is
        kept as the script set it, and each such conflict and each declared key the Trainer does
        not act on is said on stderr; all three are in ``self.mapping``."""
        if not self.assign and not (self.adopted and self.run.strategy is not None):
            raise ValueError(
                "apply: only an assigned run carries its arm's strategy: assign=True (or adopt a "
                "run of costlab.track(..., assign=True))"
            )
        run = self._open_run(args)
        if run is None:
            return args
        self.mapping = to_trainer_args(run, args=args, world_size=int(args.world_size))
        for conflict in self.mapping.conflicts:
            say(f"arm '{run.arm}': {conflict}")
        for key, why in self.mapping.unmapped.items():
            say(f"arm '{run.arm}': {key} is not applied: {why}")
        return self.mapping.apply(args)

    # -- the Trainer's events ----------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._training and self.run is not None and not self.run.closed:
            self.run.close("failed", "a new train() began before this one ended")
        run = self._open_run(args)
        self._training = run is not None
        if run is None:
            return
        self._step_tokens, self._loss_sum, self._loss_parts = 0, None, 0
        self._loss_from_model = False
        self._shifted = _shifts_labels(model)
        average = bool(getattr(args, "average_tokens_across_devices", False))
        self._loss_scale = int(args.world_size) if average and int(args.world_size) > 1 else 1
        if model is not None:
            if self._hook is not None:
                self._hook.remove()
            self._hook = model.register_forward_hook(self._forward, with_kwargs=True)
        hyper = args.to_dict() if hasattr(args, "to_dict") else {}
        run.log_params(hyper, kind="hyperparameters")
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            run.log_params(config.to_dict(), kind="model")

    def _forward(self, module, args, kwargs, output) -> None:
        """After each training forward: its trained tokens and its loss, kept as tensors (no host
        sync; read on the sampler thread)."""
        if not module.training:
            return
        batch = kwargs if any(k in kwargs for k in ("input_ids", "labels")) else args
        tokens = trained_tokens(batch, shifted=self._shifted)
        if tokens is not None:
            self._step_tokens = self._step_tokens + tokens
        loss = output.get("loss") if hasattr(output, "get") else getattr(output, "loss", None)
        if loss is not None and hasattr(loss, "detach"):
            loss = loss.detach()
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self._loss_parts += 1
            self._loss_share = kwargs.get("num_items_in_batch") is not None

    def on_step_end(self, args, state, control, **kwargs):
        if self.run is None or not self._training:
            return
        tokens, self._step_tokens = self._step_tokens, 0
        loss, parts, self._loss_sum, self._loss_parts = self._loss_sum, self._loss_parts, None, 0
        if loss is not None:  # the Trainer's step loss: the shares' sum, else the forwards' mean
            loss = loss * self._loss_scale if self._loss_share else loss / parts
            self._loss_from_model = True
        self.run.log(step=state.global_step, tokens=tokens, loss=loss)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is None or self.run.closed or not logs:
            return
        metrics = numeric_logs(logs)
        if metrics:
            self.run.log_metrics(metrics, step=state.global_step)
        if not self._loss_from_model:  # the loss computed outside the model: as logged
            loss = logs.get("loss", logs.get("train_loss"))
            if loss is not None:
                self.run.update(loss=loss)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not metrics:
            return
        if self.run is None or self.run.closed:
            self.evals.say_once(
                "outside",
                "an evaluation outside train() is not reported (the run starts and ends with "
                "it): evaluate during training, with eval_strategy",
            )
            return
        self.evals.report(
            self.run, metrics, eval_s=metrics.get("eval_runtime"), step=state.global_step
        )

    def on_train_end(self, args, state, control, **kwargs):
        self.close("succeeded")

    def close(self, status: str = "failed", error: str = "") -> None:
        """End the run now (after an exception the code caught), if it is still open."""
        self._training = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.run is not None:
            self.run.close(status, error)

    def __enter__(self) -> CostlabCallback:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.run is not None and not self.run.closed:
            self.close(*outcome_of(exc))
        return False


def _shifts_labels(model: Any) -> bool:
    """Whether the model's loss shifts its labels (a causal LM), as the Trainer decides it."""
    if model is None:
        return True
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    except ImportError:  # pragma: no cover - an older transformers
        return True
    loss_type = getattr(model, "loss_type", None)
    if loss_type is None:
        return True
    return LOSS_MAPPING.get(loss_type) is ForCausalLMLoss


def _broadcast(key: str | None) -> str | None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return key
    box = [key]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
