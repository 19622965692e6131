"""``transformers.Trainer`` reporting to costlab in one line:

    trainer = Trainer(..., callbacks=[CostlabCallback(experiment=12, arm="bf16")])

The run starts at train begin on every process (each rank streams its own device; they share one
run), takes the step count and step time at each optimizer step, the loss from the Trainer's logs
(every ``logging_steps``), and tokens: the Trainer's world count when
``include_num_input_tokens_seen`` is on (exact, gathered over the ranks), else counted from each
forward's batch (the attention mask's sum, else the input ids; times the world size). Each
evaluation during training (``eval_strategy``) goes as the run's held-out quality: ``eval_loss``,
and a named metric where one is configured (``quality_metric="accuracy",
quality_direction="higher"``), with ``eval_runtime`` as the seconds it took. It ends
``succeeded`` at train end.

The Trainer has no exception event: an exception that ends the process ends the run ``failed``
(``cancelled`` for Ctrl-C) as the process exits. Code that catches it and goes on says so with
the callback as a context manager (``with callback: trainer.train()``), or ``callback.close()``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from costlab.evaluation import EVAL_LOSS
from costlab.exits import outcome_of
from costlab.integrations import EvalReporter, shared_run_key, tokens_in
from costlab.run import Run


class CostlabCallback(TrainerCallback):
    """experiment, arm (a name or id) or assign=True, run_key: as ``costlab.track``. eval_loss:
    the key of ``on_evaluate``'s metrics reported as the held-out loss (default ``eval_loss``;
    None: none). quality_metric, quality_direction ('lower' or 'higher' is better): a named metric
    reported too, under the name given, found as that key or with the Trainer's ``eval_`` prefix
    (``"accuracy"``: ``eval_accuracy``). The other keywords are ``costlab.Run``'s.
    COSTLAB_URL / COSTLAB_TOKEN unless url= / token=."""

    def __init__(
        self,
        experiment: int,
        arm: str | int | None = None,
        *,
        assign: bool = False,
        run_key: str | None = None,
        eval_loss: str | None = EVAL_LOSS,
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
        self.evals = EvalReporter(
            eval_loss=eval_loss,
            quality_metric=quality_metric,
            quality_direction=quality_direction,
            prefixes=("eval_",),
        )
        self.options = options
        self.run: Run | None = None
        self._step_tokens: Any = 0
        self._hook = None

    @property
    def run_id(self) -> int | None:
        return None if self.run is None else self.run.run_id

    def __getstate__(self) -> dict:
        """A copy (a spawned process's, a deepcopy) starts its own run: threads do not travel."""
        state = self.__dict__.copy()
        state["run"] = None
        state["_hook"] = None
        return state

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.run is not None and not self.run.closed:
            self.run.close("failed", "a new train() began before this one ended")
        world, rank = int(args.world_size), int(args.process_index)
        key = shared_run_key(self.run_key, world_size=world, rank=rank, broadcast=_broadcast)
        self.run = Run(
            self.experiment,
            self.arm_given,
            assign=self.assign,
            run_key=key,
            rank=rank,
            local_rank=max(0, int(args.local_process_index)),
            world_size=world,
            device=str(args.device),
            barrier=_barrier if world > 1 else None,
            **self.options,
        ).start()
        self._step_tokens = 0
        if args.include_num_input_tokens_seen in ("no", False, None) and model is not None:
            self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        if not module.training:
            return
        batch = kwargs if ("input_ids" in kwargs or "attention_mask" in kwargs) else args
        tokens = tokens_in(batch)
        if tokens is not None:
            self._step_tokens = self._step_tokens + tokens

    def on_step_end(self, args, state, control, **kwargs):
        if self.run is None:
            return
        counted = args.include_num_input_tokens_seen not in ("no", False, None)
        tokens, self._step_tokens = self._step_tokens, 0
        self.run.log(
            step=state.global_step,
            tokens=None if counted else tokens,
            tokens_seen=state.num_input_tokens_seen if counted else None,
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is not None and logs and "loss" in logs:
            self.run.update(loss=logs["loss"])

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
