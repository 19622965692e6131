"""Optuna proposes the next candidate; the study is rebuilt from the sweep's probe rows each time.

The rows are the truth (Postgres), so nothing else needs storing: measured probes are added
as complete trials, infeasible ones as failed, pending ones as running. A proposal that repeats
a known point is told that point's result (or failure) and asked again, so a duplicate is never
measured twice and the sampler still learns from it.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from apps.sweeps.space import params_key, space_points, space_size

optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_ASKS = 64


def _distributions(expanded: dict[str, list[Any]]) -> dict[str, CategoricalDistribution]:
    return {key: CategoricalDistribution(values) for key, values in expanded.items()}


def study_for(*, sampler: str, seed: int, expanded: dict[str, list[Any]], directions: int,
              known: list[tuple[dict[str, Any], str, list[float] | None]]) -> optuna.Study:
    """An in-memory study holding every known probe: (params, state, values)."""
    if sampler == "grid":
        chosen = optuna.samplers.GridSampler(expanded, seed=seed)
    else:
        population = max(4, min(20, len(known) // 2 or 4))
        chosen = optuna.samplers.NSGAIISampler(population_size=population, seed=seed + len(known))
    study = optuna.create_study(directions=["minimize"] * directions, sampler=chosen)
    distributions = _distributions(expanded)
    for params, state, values in known:
        if state == "complete":
            study.add_trial(create_trial(params=params, distributions=distributions, values=values))
        else:
            study.add_trial(create_trial(params=params, distributions=distributions,
                                         state=TrialState.FAIL if state == "fail" else TrialState.RUNNING))
    return study


def propose(*, sampler: str, seed: int, expanded: dict[str, list[Any]], directions: int,
            known: list[tuple[dict[str, Any], str, list[float] | None]]) -> dict[str, Any] | None:
    """The next unmeasured point Optuna picks, or None once the space holds none."""
    seen = {params_key(p): (state, values) for p, state, values in known}
    if len(seen) >= space_size(expanded):
        return None
    study = study_for(sampler=sampler, seed=seed, expanded=expanded, directions=directions, known=known)
    distributions = _distributions(expanded)
    for _ in range(MAX_ASKS):
        trial = study.ask(distributions)
        params = dict(trial.params)
        state, values = seen.get(params_key(params), (None, None))
        if state is None:
            return params
        if state == "complete":
            study.tell(trial, values)
        else:
            study.tell(trial, state=TrialState.FAIL)
    # The sampler keeps repeating itself (a converged population): take the first unseen grid point.
    return next((p for p in space_points(expanded) if params_key(p) not in seen), None)
