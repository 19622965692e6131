"""Optuna's proposals, rebuilt from rows: the grid visits every point once, NSGA-II never repeats a
point and keeps its generations, failed points are not proposed again."""

from apps.sweeps.proposer import Known, population_size, propose
from apps.sweeps.space import params_key, space_points

SPACE = {
    "train.global_batch": [1, 2, 4],
    "model.seq_len": [32, 64],
    "precision.compute_dtype": ["fp32", "bf16"],
}


def cost(
    params,
):  # a made-up but monotone world: bigger batches and bf16 are cheaper, and use more memory
    gb, sl, bf16 = (
        params["train.global_batch"],
        params["model.seq_len"],
        params["precision.compute_dtype"] == "bf16",
    )
    return [
        1.0 / gb * (0.9 if bf16 else 1.0) * (0.8 if sl == 64 else 1.0),
        gb * sl * (0.6 if bf16 else 1.0),
    ]


def run(sampler, budget, seed=0, fail=lambda p: False):
    known = []
    for _ in range(budget):
        proposal = propose(
            sampler=sampler,
            seed=seed,
            expanded=SPACE,
            directions=2,
            probe_count=budget,
            known=known,
        )
        if proposal is None:
            break
        failed = fail(proposal.params)
        known.append(
            Known(
                params=proposal.params,
                state="fail" if failed else "complete",
                values=None if failed else cost(proposal.params),
                attrs=proposal.attrs,
            )
        )
    return known


def test_the_grid_visits_every_point_exactly_once_then_stops():
    known = run("grid", 20)
    assert len(known) == 12
    assert {params_key(k.params) for k in known} == {params_key(p) for p in space_points(SPACE)}
    assert all("grid_id" in k.attrs for k in known)


def test_nsga2_never_repeats_a_point_and_records_generations():
    for seed in range(5):
        known = run(
            "nsga2",
            9,
            seed=seed,
            fail=lambda p: p["train.global_batch"] == 4 and p["model.seq_len"] == 64,
        )
        keys = [params_key(k.params) for k in known]
        assert len(keys) == len(set(keys)) == 9
        generations = [k.attrs.get("NSGAIISampler:generation") for k in known]
        assert (
            generations[0] == 0 and max(generations) >= 1
        )  # it moved past the random first generation


def test_population_size_gives_small_budgets_several_generations():
    assert population_size(6) == 2 and population_size(30) == 10 and population_size(1000) == 20


def test_tpe_never_repeats_a_point():
    keys = [params_key(k.params) for k in run("tpe", 9, seed=1)]
    assert len(keys) == len(set(keys)) == 9
