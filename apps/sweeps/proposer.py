"""Optuna proposes the next candidate; the study is rebuilt from the sweep's probe rows each time.

The rows are the truth (Postgres): measured probes are added as complete trials, infeasible
ones as failed, pending ones as running, each with the system attrs Optuna gave it when it was
proposed (NSGA-II's generation, the grid's point id), so the sampler carries on where it was.
A proposal that repeats a known point is told that point's result (or failure) and asked again,
so a duplicate is never measured twice and the sampler still learns from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from apps.sweeps.space import params_key, space_points, space_size

optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_ASKS = 64


def _distributions(expanded: dict[str, list[Any]]) -> dict[str, CategoricalDistribution]:
    return {key: CategoricalDistribution(values) for key, values in expanded.items()}


@dataclass(frozen=True)
class Known:
    """A probe as the sampler sees it."""

    params: dict[str, Any]
    state: str  # complete, fail, running
    values: list[float] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Proposal:
    params: dict[str, Any]
    attrs: dict[str, Any]


def population_size(probe_count: int) -> int:
    """NSGA-II's generation size: small budgets need several generations, not one random batch."""
    return max(2, min(20, probe_count // 3))


def study_for(
    *,
    sampler: str,
    seed: int,
    expanded: dict[str, list[Any]],
    directions: int,
    probe_count: int,
    known: list[Known],
) -> optuna.Study:
    """An in-memory study holding every known probe."""
    if sampler == "grid":
        chosen = optuna.samplers.GridSampler(expanded, seed=seed)
    elif sampler == "tpe":
        chosen = optuna.samplers.TPESampler(
            n_startup_trials=max(2, min(10, probe_count // 2)), seed=seed + len(known)
        )
    else:
        chosen = optuna.samplers.NSGAIISampler(
            population_size=population_size(probe_count), seed=seed + len(known)
        )
    study = optuna.create_study(directions=["minimize"] * directions, sampler=chosen)
    distributions = _distributions(expanded)
    states = {
        "complete": TrialState.COMPLETE,
        "fail": TrialState.FAIL,
        "running": TrialState.RUNNING,
    }
    for k in known:
        study.add_trial(
            create_trial(
                params=k.params,
                distributions=distributions,
                state=states[k.state],
                values=k.values if k.state == "complete" else None,
                system_attrs=k.attrs,
            )
        )
    return study


def propose(
    *,
    sampler: str,
    seed: int,
    expanded: dict[str, list[Any]],
    directions: int,
    probe_count: int,
    known: list[Known],
) -> Proposal | None:
    """The next unmeasured point Optuna picks, or None once the space holds none."""
    seen = {params_key(k.params): (k.state, k.values) for k in known}
    if len(seen) >= space_size(expanded):
        return None
    study = study_for(
        sampler=sampler,
        seed=seed,
        expanded=expanded,
        directions=directions,
        probe_count=probe_count,
        known=known,
    )
    distributions = _distributions(expanded)
    for _ in range(MAX_ASKS):
        trial = study.ask(distributions)
        params = dict(trial.params)
        state, values = seen.get(params_key(params), (None, None))
        if state is None:
            return Proposal(
                params=params, attrs=study._storage.get_trial_system_attrs(trial._trial_id)
            )
        if state == "complete":
            study.tell(trial, values)
        else:
            study.tell(trial, state=TrialState.FAIL)
    # The sampler keeps repeating itself (a converged population): take the first unseen grid point.
    params = next((p for p in space_points(expanded) if params_key(p) not in seen), None)
    return None if params is None else Proposal(params=params, attrs={})
