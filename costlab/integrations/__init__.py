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


def tokens_in(batch: Any) -> Any:
    """The tokens a batch trains on, without a host sync: the attention mask's sum (a 0-d tensor,
    read later on the sampler thread) where there is one, else the input ids' count; a tuple or
    list: its first element; a tensor of integer ids: its size. None: nothing to count."""
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        mask = batch.get("attention_mask") if hasattr(batch, "get") else None
        if mask is not None:
            return mask.sum()
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        return None if ids is None else ids.numel()
    if isinstance(batch, list | tuple):
        return tokens_in(batch[0]) if batch else None
    dtype = getattr(batch, "dtype", None)
    if (
        dtype is not None
        and hasattr(batch, "numel")
        and not getattr(dtype, "is_floating_point", True)
    ):
        return batch.numel()
    return None


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
