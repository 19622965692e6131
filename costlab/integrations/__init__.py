"""One-line callbacks for the trainers teams already run: ``transformers.Trainer``
(``costlab.integrations.transformers``) and Lightning (``costlab.integrations.lightning``).
Each imports its framework only when imported itself."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

from costlab.delivery import say
from costlab.evaluation import EVAL_LOSS, direction_of, metric_name


def numeric_logs(logs: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers of a framework's logged metrics (a number or a 0-d tensor; not a bool, not a
    string), by name: what goes to ``Run.log_metrics``."""
    out = {}
    for name, value in logs.items():
        if isinstance(value, bool) or isinstance(value, str) or value is None:
            continue
        if isinstance(value, int | float) or getattr(value, "ndim", None) == 0:
            out[str(name)] = value
    return out


def which_run_checked(run, experiment, arm, assign, run_key, options) -> None:
    """A callback names its run one way: a started run to adopt (`run=`), or where to start one
    (experiment, arm or assign, run_key and the Run options); ValueError naming the argument."""
    if run is not None and (experiment, arm, assign, run_key, options) != (
        None,
        None,
        False,
        None,
        {},
    ):
        raise ValueError(
            "run: an adopted run is already placed; give experiment, arm, assign, run_key "
            "and the Run options to costlab.track instead"
        )
    if run is None and experiment is None:
        raise ValueError("experiment: name the experiment, or pass a started run (run=)")


def run_opened(
    callback: Any,
    *,
    world: int,
    rank: int,
    local_rank: int,
    device: str,
    broadcast,
    barrier,
    what: str,
) -> Any:
    """The run a callback's training reports to: its open one (adopted, or started by apply),
    else a new one started now on every rank under one run key (None, said once, when an adopted
    run has already ended). `callback` holds experiment, arm_given, assign, run_key, options,
    run and adopted; `what` names the training ("train()", "fit") in that line."""
    from costlab.run import Run

    if callback.run is not None and not callback.run.closed:
        return callback.run
    if callback.adopted:
        say(
            f"the run handed to the callback (run=) has ended; this {what} is not tracked: hand "
            "over a new run"
        )
        return None
    key = shared_run_key(callback.run_key, world_size=world, rank=rank, broadcast=broadcast)
    callback.run = Run(
        callback.experiment,
        callback.arm_given,
        assign=callback.assign,
        run_key=key,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        device=device,
        barrier=barrier if world > 1 else None,
        **callback.options,
    ).start()
    return callback.run


def shared_run_key(given: str | None, *, world_size: int, rank: int, broadcast) -> str | None:
    """The run key every rank of the job uses: the one given (or COSTLAB_RUN_KEY), else rank 0's
    fresh one, sent to the others by `broadcast(key) -> key` (the framework's collective)."""
    key = given or os.environ.get("COSTLAB_RUN_KEY", "").strip() or None
    if key or world_size == 1:
        return key
    return broadcast(f"sdk-{uuid.uuid4().hex}" if rank == 0 else None)


class EvalReporter:
    """What a callback reports of its framework's evaluation metrics: the key read as the held-out
    loss (`eval_loss`; None: none), and a named metric with its direction (`quality_metric`,
    `quality_direction`; checked here, at construction), looked up as named or with one of
    `prefixes`. A value the run refuses (a diverged NaN) is said on stderr, never raised into the
    training; so is a configured metric the evaluation lacks, once."""

    def __init__(
        self,
        *,
        eval_loss: str | None,
        quality_metric: str | None,
        quality_direction: str | None,
        prefixes: tuple[str, ...] = (),
    ):
        self.eval_loss, self.metric, self.direction = eval_loss, quality_metric, None
        if quality_metric is not None:
            metric_name(quality_metric, "quality_metric")
            self.direction = direction_of(quality_direction, quality_metric, "quality_direction")
        elif quality_direction is not None:
            raise ValueError("quality_metric: name the metric that quality_direction is for")
        self.prefixes = prefixes
        self._said: set[str] = set()

    def say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            say(message)

    def _find(self, metrics: Mapping[str, Any], name: str) -> Any:
        for key in (name, *(prefix + name for prefix in self.prefixes)):
            if metrics.get(key) is not None:
                return metrics[key]
        self.say_once(name, f"metric '{name}' is not among the evaluation's ({', '.join(metrics)})")
        return None

    def report(self, run: Any, metrics: Mapping[str, Any], *, eval_s: Any, step: int) -> None:
        """Report one evaluation's `metrics` to `run` (a started, open costlab.Run)."""
        loss = self._find(metrics, self.eval_loss) if self.eval_loss else None
        value = None
        if self.metric is not None and not (self.metric == EVAL_LOSS and loss is not None):
            value = self._find(metrics, self.metric)
        if loss is None and value is None:
            return
        metric = None if value is None else self.metric
        try:
            run.log_eval(
                loss,
                metric=metric,
                value=value,
                direction=None if value is None else self.direction,
                eval_s=eval_s,
            )
        except ValueError as exc:
            say(f"the evaluation at step {step} is not reported: {exc}")
