"""Reads for attribution: what is due, the comparison's tables and pricing faults, the re-pricing
of a report, and the tick's history (snapshots). The rollup's sums and run-level moments are
apps.attribution.evidence.moments."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import (
    F,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce, Now

from apps.attribution.decide.decisions import ArmSums
from apps.attribution.decide.quality import QualitySums
from apps.attribution.evidence.comparison import MICRO, Comparison
from apps.attribution.evidence.moments import exact_at, unit_prices
from apps.attribution.models import AttributionSnapshot, AttributionWindow, FreezeEvent, RunWindow
from apps.experiments.models import Experiment, Run
from apps.pricing.models import GpuPrice, PricingTable
from apps.pricing.selectors import pricing_tables_in_force
from apps.telemetry.models import RunEvaluation, RunRepricing

# Beat fires on a fixed period; an experiment is due when its interval has passed, give or
# take this much jitter, so a 30 s interval on a 5 s beat is attributed every 30 s, not 35.
DUE_SLACK_S = 1.0


def _last_window() -> QuerySet:
    return AttributionWindow.objects.filter(experiment=OuterRef("pk")).order_by("-number")


def experiments_due(*, now: datetime) -> list[int]:
    """The active experiments whose last window ended at least an interval ago: their ids alone
    (a 1,000-experiment tick with a few hundred of them moved loaded a model instance, its tenant
    and its cost model for every one: 0.08 s of a 0.5-s tick); `experiments_load` loads the ones
    attributed."""
    last = _last_window()
    rows = (
        Experiment.objects.filter(status=Experiment.Status.ACTIVE)
        .annotate(last_end=Subquery(last.values("window_end")[:1]))
        .order_by("pk")
        .values_list("pk", "attribution_interval_s", "last_end")
    )
    return [
        pk
        for pk, interval_s, last_end in rows
        if last_end is None
        or (now > last_end and now - last_end >= timedelta(seconds=interval_s - DUE_SLACK_S))
    ]


def experiments_load(*, ids: list[int]) -> list[Experiment]:
    """These experiments, in id order, with their cost model and tenant, annotated with their
    last window (last_window_id, last_number, last_end)."""
    last = _last_window()
    return list(
        Experiment.objects.filter(pk__in=ids)
        .select_related("cost_model", "tenant")
        .annotate(
            last_window_id=Subquery(last.values("pk")[:1]),
            last_number=Subquery(last.values("number")[:1]),
            last_end=Subquery(last.values("window_end")[:1]),
        )
        .order_by("pk")
    )


def runs_moved(*, experiment_ids: list[int]) -> dict[int, list[int]]:
    """Of these experiments, those with a run whose priced totals moved past its cursor, with
    those runs (experiment id -> run ids): the tick records observations of these runs alone,
    by their keys, rather than comparing every run of the experiments with its cursor again.

    A late sample re-prices a run below its priced_seq: its cost or tokens move, not its seq.
    """
    moved = Run.objects.filter(experiment_id__in=experiment_ids).filter(
        Q(attribution_cursor__isnull=True, priced_seq__gte=0)
        | Q(priced_seq__gt=F("attribution_cursor__priced_seq"))
        | ~Q(cost_usd=F("attribution_cursor__cost_usd"))
        | ~Q(tokens=F("attribution_cursor__tokens"))
    )
    out: dict[int, list[int]] = {}
    for experiment_id, run_id in moved.order_by("pk").values_list("experiment_id", "pk"):
        out.setdefault(experiment_id, []).append(run_id)
    return out


def comparisons_at(*, experiments: list[Experiment], at: datetime) -> dict[int, Comparison]:
    """Per experiment: the table its arms are compared at (pinned, else in force at `at`),
    in one query."""
    tables = pricing_tables_in_force(
        tenant_ids={e.tenant_id for e in experiments},
        pinned_ids={e.pricing_table_id for e in experiments if e.pricing_table_id},
        at=at,
    )
    out = {}
    for e in experiments:
        table = tables.get(
            ("pinned", e.pricing_table_id) if e.pricing_table_id else ("tenant", e.tenant_id)
        )
        out[e.pk] = Comparison.of(
            table_id=table.pk if table else None,
            valid_from=table.valid_from if table else None,
            cost_model=e.cost_model,
        )
    return out


SNAPSHOT_SUMS = {
    "observations": "observations",
    "runs": "runs",
    "samples": "samples",
    "cost": "cost_usd",
    "tokens": "tokens",
    "steps": "steps",
    "gpu_seconds": "gpu_seconds",
    "wall_s": "wall_s",
    "energy_j": "energy_j",
    "estimated": "energy_estimated",
    "cost_sq": "cost_sq",
    "cost_tokens": "cost_tokens",
    "tokens_sq": "tokens_sq",
    "cost_steps": "cost_steps",
    "steps_sq": "steps_sq",
    "compared": "compared_usd",
}


def snapshot_sums(*, window_ids: list[int]) -> dict[int, tuple[ArmSums, int, int | None]]:
    """Per arm: the cumulative sums its snapshot in one of these windows carried, its epoch,
    its comparison table."""
    rows = AttributionSnapshot.objects.filter(window_id__in=window_ids).values(
        "arm_id", "epoch_start", "pricing_table_id", *SNAPSHOT_SUMS.values()
    )
    return {
        r["arm_id"]: (
            ArmSums.from_row({k: r[v] for k, v in SNAPSHOT_SUMS.items()}),
            r["epoch_start"],
            r["pricing_table_id"],
        )
        for r in rows
    }


def unfreeze_epochs(*, experiment_ids: list[int]) -> dict[int, int]:
    """Per arm: the window number its evidence restarts after (its last unfreeze),
    for arms ever unfrozen."""
    rows = (
        FreezeEvent.objects.filter(
            action=FreezeEvent.Action.UNFREEZE, experiment_id__in=experiment_ids
        )
        .values("arm_id")
        .annotate(n=Max("window__number"))
        .order_by()
    )
    return {r["arm_id"]: r["n"] or 0 for r in rows}


def pricing_faults(
    *, experiments: list[Experiment], window_ids: list[int], now: datetime
) -> dict[int, tuple[str, list[int]]]:
    """Experiments whose runs of these windows would be priced at 0 for lack of a price: reason,
    run ids.

    A GPU run needs a SKU, and that SKU a price in every table it was priced with (the pinned
    table, or the tenant's tables in force from its start until now). Checked per (experiment,
    SKU) from its earliest run start, which covers every table its runs used; run by run only
    where that finds a gap. Four queries when all is priced.
    """
    faults: dict[int, tuple[list[str], list[int]]] = defaultdict(lambda: ([], []))
    pinned = [e.pricing_table_id for e in experiments if e.pricing_table_id]
    tables = list(
        PricingTable.objects.filter(
            Q(tenant_id__in={e.tenant_id for e in experiments}, valid_from__lte=now)
            | Q(pk__in=pinned)
        )
        .values("pk", "tenant_id", "valid_from", "name")
        .order_by("valid_from")
    )
    by_tenant, by_pk = defaultdict(list), {t["pk"]: t for t in tables}
    for t in tables:
        if t["valid_from"] <= now:
            by_tenant[t["tenant_id"]].append(t)
    for e in experiments:
        if e.pricing_table_id is None and not by_tenant[e.tenant_id]:
            faults[e.pk][0].append(
                f"pricing_table: tenant '{e.tenant.slug}' has no pricing table in force, "
                "so every cost would be 0"
            )
    gpu = RunWindow.objects.filter(window_id__in=window_ids, run__gpu_count__gt=0)
    groups = list(
        gpu.values("window__experiment_id", "run__gpu_sku_id")
        .order_by()
        .annotate(start=Min(Coalesce("run__started_at", "run__created_at")))
    )
    priced = set(
        GpuPrice.objects.filter(
            pricing_table_id__in=list(by_pk), sku_id__in={g["run__gpu_sku_id"] for g in groups}
        ).values_list("pricing_table_id", "sku_id")
    )
    experiment_of = {e.pk: e for e in experiments}

    def missing(e: Experiment, sku_id: int, start: datetime) -> list[dict]:
        return [
            t for t in _tables_used(e, by_tenant, by_pk, start) if (t["pk"], sku_id) not in priced
        ]

    suspect = [
        g
        for g in groups
        if g["run__gpu_sku_id"] is None
        or missing(experiment_of[g["window__experiment_id"]], g["run__gpu_sku_id"], g["start"])
    ]
    if suspect:
        which = Q()
        for g in suspect:
            sku = (
                {"run__gpu_sku_id": g["run__gpu_sku_id"]}
                if g["run__gpu_sku_id"]
                else {"run__gpu_sku__isnull": True}
            )
            which |= Q(window__experiment_id=g["window__experiment_id"], **sku)
        for r in (
            gpu.filter(which)
            .values(
                "run_id",
                "window__experiment_id",
                "run__gpu_sku_id",
                "run__gpu_sku__name",
                "run__device",
                "run__started_at",
                "run__created_at",
            )
            .order_by("run_id")
        ):
            e = experiment_of[r["window__experiment_id"]]
            if r["run__gpu_sku_id"] is None:
                reason = (
                    f"device: run {r['run_id']} ran on "
                    f"'{r['run__device'] or 'an unknown GPU'}', which "
                    "matches no GPU SKU, so its GPU time has no price"
                )
            else:
                gaps = missing(
                    e, r["run__gpu_sku_id"], r["run__started_at"] or r["run__created_at"]
                )
                if not gaps:
                    continue
                reason = (
                    f"pricing: table '{gaps[0]['name']}' has no price for GPU SKU "
                    f"'{r['run__gpu_sku__name']}' (run {r['run_id']})"
                )
            faults[e.pk][0].append(reason)
            faults[e.pk][1].append(r["run_id"])
    return {pk: ("; ".join(dict.fromkeys(reasons)), runs) for pk, (reasons, runs) in faults.items()}


def _tables_used(e: Experiment, by_tenant: dict, by_pk: dict, start: datetime) -> list[dict]:
    if e.pricing_table_id is not None:
        return [by_pk[e.pricing_table_id]] if e.pricing_table_id in by_pk else []
    tables = by_tenant[e.tenant_id]
    first = max((i for i, t in enumerate(tables) if t["valid_from"] <= start), default=0)
    return tables[first:]


def arm_repricing(*, experiment: Experiment, comparison: Comparison) -> dict[int, Decimal]:
    """Per arm: what pricing the usage its windows rolled up at the comparison's table adds to its
    billed cost (the report's comparison), where some of it may have been billed at another
    version (experiments_priced_from_usage); nothing otherwise. A few queries."""
    if not comparison.needs_usage_pricing or experiment.pk not in experiments_priced_from_usage(
        experiments=[experiment], comparisons={experiment.pk: comparison}
    ):
        return {}
    rows = list(
        RunWindow.objects.filter(window__experiment_id=experiment.pk)
        .values("arm_id", "run__gpu_sku_id", "run__vcpus", "run__memory_gb")
        .annotate(g=Sum("gpu_seconds"), ws=Sum("wall_s"), en=Sum("energy_j"), c=Sum("cost_usd"))
        .order_by()
    )
    units = unit_prices({0: comparison}, skus={0: {r["run__gpu_sku_id"] for r in rows}})
    out: dict[int, Decimal] = defaultdict(Decimal)
    for r in rows:
        at = units[(0, r["run__gpu_sku_id"])].times(
            gpu_seconds=exact_at(r["g"], 6),
            energy_j=exact_at(r["en"], 6),
            wall_s=exact_at(r["ws"], 6),
            vcpus=r["run__vcpus"] or 0,
            memory_gb=r["run__memory_gb"] or 0,
        )
        out[r["arm_id"]] += at - exact_at(r["c"], 6)
    return {arm_id: usd.quantize(MICRO) for arm_id, usd in out.items()}


def snapshot_series(*, experiment: Experiment, since: datetime | None = None) -> QuerySet:
    """The experiment's snapshots in window order: the deviation timeline of the dashboard."""
    qs = AttributionSnapshot.objects.filter(experiment=experiment).select_related("arm")
    if since is not None:
        qs = qs.filter(window_end__gte=since)
    return qs.order_by("window_end", "arm_id")


def snapshots_latest(*, experiment: Experiment) -> dict[int, AttributionSnapshot]:
    """Per arm, the snapshot of the experiment's latest window (with its comparison table)."""
    last = AttributionWindow.objects.filter(experiment=experiment).order_by("-number").first()
    if last is None:
        return {}
    snapshots = AttributionSnapshot.objects.filter(window=last).select_related("pricing_table")
    return {s.arm_id: s for s in snapshots}


def quality_runs(*, experiment_ids: list[int]) -> dict[int, list[tuple[int, float]]]:
    """Per arm: (run id, final value) of every finished run that evaluated its experiment's quality
    metric: succeeded, on the arm's current strategy revision, and finished after the arm's last
    unfreeze (its evidence starts over then, as cost's does). One query."""
    if not experiment_ids:
        return {}
    last = RunEvaluation.objects.filter(
        run_id=OuterRef("pk"), metric=OuterRef("experiment__quality_metric")
    ).order_by("-seq")
    unfrozen = FreezeEvent.objects.filter(
        arm_id=OuterRef("arm_id"), action=FreezeEvent.Action.UNFREEZE
    ).order_by("-created_at")
    rows = (
        Run.objects.filter(
            experiment_id__in=experiment_ids,
            status=Run.Status.SUCCEEDED,
            config_revision=F("arm__revision"),
        )
        .annotate(
            q_value=Subquery(last.values("value")[:1]),
            q_since=Subquery(unfrozen.values("created_at")[:1]),
        )
        .filter(q_value__isnull=False)
        .filter(Q(q_since__isnull=True) | Q(finished_at__gt=F("q_since")))
        .order_by("arm_id", "pk")
        .values_list("arm_id", "pk", "q_value")
    )
    out: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for arm_id, run_id, value in rows:
        out[arm_id].append((run_id, value))
    return dict(out)


def quality_sums(*, experiment_ids: list[int]) -> dict[int, QualitySums]:
    """Per arm: the sufficient statistics of quality_runs' final values."""
    return {
        arm_id: QualitySums.of(v for _, v in runs)
        for arm_id, runs in quality_runs(experiment_ids=experiment_ids).items()
    }


@dataclass(frozen=True)
class QualityCurve:
    """One run's evaluations of the experiment's metric against its cumulative cost."""

    run_id: int
    arm_id: int
    finished: bool  # succeeded: its last value counts in the quality verdict
    points: list[tuple[float, float, int]]  # (USD so far, value, tokens so far)


def quality_curves(*, experiment: Experiment, limit: int = 20_000) -> list[QualityCurve]:
    """The evaluation curves of the experiment's runs that evaluated its metric (at most `limit`
    evaluations, the newest runs' first).

    A point's USD is the run's bill pro rata of its telemetry's wall time at the evaluation
    (exact while its prices and power draw hold steady over the run; flagged as estimated
    wherever it is shown). One query."""
    rows = (
        RunEvaluation.objects.filter(run__experiment=experiment, metric=experiment.quality_metric)
        .order_by("-run_id", "seq")
        .values_list(
            "run_id",
            "run__arm_id",
            "run__status",
            "run__cost_usd",
            "run__samples_from",
            "run__samples_to",
            "ts",
            "value",
            "tokens",
        )[:limit]
    )
    out: dict[int, QualityCurve] = {}
    for pk, arm_id, status, cost, first, last, ts, value, tokens in rows:
        curve = out.get(pk)
        if curve is None:
            curve = out[pk] = QualityCurve(pk, arm_id, status == Run.Status.SUCCEEDED, [])
        span = (last - first).total_seconds() if first and last else 0.0
        share = 1.0 if span <= 0 else min(max((ts - first).total_seconds() / span, 0.0), 1.0)
        curve.points.append((float(cost) * share, value, tokens))
    return [out[pk] for pk in sorted(out)]


def experiments_priced_from_usage(
    *, experiments: list[Experiment], comparisons: dict[int, Comparison]
) -> set[int]:
    """The experiments whose runs may hold usage billed at another price version than their
    comparison's table: a version other than it in force (from its valid_from until the next
    version's valid_from or posting, whichever is later) at any time between the experiment's
    first and last priced usage, a window recorded at another table, or a run re-priced by hand.
    Their arms are compared on usage priced at the one table (apps.attribution.evidence.moments);
    the others' bills are already at it. Conservative: a false "may" costs a query, never a wrong
    figure. One query where every tenant has one table (the common case), four at most."""
    ids = [e.pk for e in experiments if comparisons[e.pk].needs_usage_pricing]
    if not ids:
        return set()
    tenants = {e.pk: e.tenant_id for e in experiments}
    versions: dict[int, list] = defaultdict(list)
    for tenant_id, pk, valid_from, created_at in (
        PricingTable.objects.filter(tenant_id__in={tenants[i] for i in ids})
        .order_by("tenant_id", "valid_from", "pk")
        .values_list("tenant_id", "pk", "valid_from", "created_at")
    ):
        versions[tenant_id].append((pk, valid_from, created_at))
    ids = [i for i in ids if len(versions[tenants[i]]) > 1]  # one table: every bill is at it
    if not ids:
        return set()
    pinned = {e.pk for e in experiments if e.pricing_table_id}
    out = set(
        RunRepricing.objects.filter(run__experiment_id__in=ids)
        .values_list("run__experiment_id", flat=True)
        .distinct()
    )
    ids = [i for i in ids if i not in pinned]  # a pinned table bills everything at it
    # A window recorded at another table than the comparison's: its usage was observed then.
    out |= set(
        AttributionWindow.objects.filter(experiment_id__in=ids, pricing_table__isnull=False)
        .exclude(pricing_table_id__in=[comparisons[i].table_id for i in ids])
        .values_list("experiment_id", flat=True)
        .distinct()
    )
    # A run's priced span: its stored samples', else (totals written around ingest) its life.
    spans = {
        row["experiment_id"]: (row["lo"], row["hi"])
        for row in Run.objects.filter(experiment_id__in=ids, priced_seq__gte=0)
        .values("experiment_id")
        .annotate(
            lo=Min(Coalesce("samples_from", "started_at", "created_at")),
            hi=Max(Coalesce("samples_to", "finished_at", Now())),
        )
        .order_by()
    }
    for experiment_id in ids:
        if experiment_id not in spans:
            continue
        lo, hi = spans[experiment_id]
        tables = versions[tenants[experiment_id]]
        for i, (pk, valid_from, _) in enumerate(tables):
            end = max(tables[i + 1][1], tables[i + 1][2]) if i + 1 < len(tables) else None
            if (
                pk != comparisons[experiment_id].table_id
                and valid_from <= hi
                and (end is None or end > lo)
            ):
                out.add(experiment_id)
                break
    return out
