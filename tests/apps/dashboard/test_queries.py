"""Every page costs a fixed number of queries, however many experiments, arms and runs there are."""

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.attribution.services import arm_freeze, attribution_tick
from apps.experiments.models import Run
from apps.telemetry.models import RunMetric
from tests.apps.dashboard.world import run_of, train
from tests.factories import ArmFactory, ExperimentFactory

pytestmark = pytest.mark.django_db

# Session and user are two of each. Counted, so that a query per row (an N+1) fails the large case.
LIST_QUERIES = 6  # + the latest snapshots (verdicts) and freeze events of every listed experiment
# The report re-prices usage recorded under other tables: one query over the rollup; outliers: one;
# the latest window's snapshots with their arms' freezes and the window (verdict card): one, and
# where runs are outliers, the verdict without them one more (test_verdicts.py holds that page to
# this limit too); the verdicts per device class (apps.attribution.evidence.device_classes): one.
# The alert channels of the page and whether the user manages them: two. The report's unpriced
# SKUs per arm, and its cost to the control's quality (the evaluation curves): one each; the
# quality chart's curves: one.
EXPERIMENT_QUERIES = 26
LIVE_QUERIES = 11
# the run, its samples, its attempts ..., its arm's outliers, its arm's colour, its kernel
# diagnosis, its held-out evaluations; its training metrics: their summary, the series sent whole
# and those bucketed (three, however many metrics)
RUN_QUERIES = 12
PRICING_QUERIES = 5


def grow(w, *, experiments: int, arms: int, runs_per_arm: int):
    for _ in range(experiments):
        e = ExperimentFactory(tenant=w.experiment.tenant, status="active")
        for i in range(arms):
            run_of(ArmFactory(experiment=e, is_control=i == 0))
    for _ in range(arms):
        arm = ArmFactory(experiment=w.experiment)
        for _ in range(runs_per_arm):
            train(run_of(arm), n=5)
    for arm in (w.control, w.candidate):
        for _ in range(runs_per_arm):
            train(run_of(arm), n=5, eval_loss=3.0)  # each sample evaluated: the quality chart's
    running = train(run_of(w.candidate, status=Run.Status.RUNNING), n=5)
    RunMetric.objects.bulk_create(  # ten metrics, one bucketed on the page (over 400 values)
        RunMetric(run=running, seq=seq, ts=timezone.now(), step=seq, name=name, value=1.0)
        for name, values in [("loss", 450), *((f"m{i}", 3) for i in range(9))]
        for seq in range(values)
    )
    attribution_tick(now=timezone.now())
    arm_freeze(arm_id=w.candidate.pk, reason="test", evidence={})


@pytest.mark.parametrize("size", [(0, 0, 1), (6, 3, 4)], ids=["small", "large"])
def test_query_counts_do_not_grow_with_data(member, w, size, django_assert_max_num_queries):
    grow(w, experiments=size[0], arms=size[1], runs_per_arm=size[2])
    run = Run.objects.filter(experiment=w.experiment, status=Run.Status.RUNNING).get()
    since = int(timezone.now().timestamp() * 1000) - 5000
    with django_assert_max_num_queries(LIST_QUERIES):
        assert member.get(reverse("dashboard:experiments")).status_code == 200
    with django_assert_max_num_queries(EXPERIMENT_QUERIES):
        assert (
            member.get(reverse("dashboard:experiment", args=[w.experiment.pk])).status_code == 200
        )
    with django_assert_max_num_queries(LIVE_QUERIES):
        assert (
            member.get(
                reverse("dashboard:experiment-live", args=[w.experiment.pk]), {"since": since}
            ).status_code
            == 200
        )
    with django_assert_max_num_queries(RUN_QUERIES):
        assert member.get(reverse("dashboard:run", args=[run.pk])).status_code == 200
    with django_assert_max_num_queries(PRICING_QUERIES):
        assert member.get(reverse("dashboard:pricing")).status_code == 200
