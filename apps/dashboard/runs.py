"""Reads of the runs page, the compare view, the CSV exports and the spend page.

Set-based: a page of runs is two queries (count, page) whatever the filters; the compare view a
fixed handful; spend one grouped query per page. Always scoped to the user's tenants."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

from django.db.models import Count, DecimalField, F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from apps.attribution.reads import experiment_report
from apps.billing.interface import carbon_shown
from apps.dashboard import charts
from apps.dashboard.quality import quality_csv_columns, quality_csv_values
from apps.dashboard.selectors import runs_visible, tenants_of
from apps.dashboard.series import run_series
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.search import runs_search
from apps.tenants.models import Tenant

COMPARE_MIN, COMPARE_MAX = 2, 4
# ArmReport's quality fields: the comparison CSV says them in columns of their own, at its end.
QUALITY_FIELDS = ("quality", "usd_to_target", "runs_reached_target", "runs_evaluated")
SORTS = {
    "queued": "queued_at",
    "cost": "cost_usd",
    "tokens": "tokens",
    "steps": "steps",
    "finished": "finished_at",
    "experiment": "experiment__name",
    "arm": "arm__name",
    "status": "status",
}
DEFAULT_SORT = "-queued"


# ---------------------------------------------------------------------------------------------
# The runs list (and its CSV)
# ---------------------------------------------------------------------------------------------
def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def runs_filtered(
    *,
    user,
    experiment: Experiment | None = None,
    arm: Arm | None = None,
    status: str = "",
    git_sha: str = "",
    since: date | None = None,
    until: date | None = None,
    sort: str = DEFAULT_SORT,
    q: str = "",
) -> QuerySet[Run]:
    """Every run of the user's tenants matching the filters (dates are UTC days, `until`
    included) and the search `q` (apps.experiments.search.runs_search, as the API's `?q=`)."""
    runs = runs_search(runs_visible(user=user), q)
    if experiment is not None:
        runs = runs.filter(experiment=experiment)
    if arm is not None:
        runs = runs.filter(arm=arm)
    if status:
        runs = runs.filter(status=status)
    if git_sha:
        runs = runs.filter(git_sha__startswith=git_sha.lower())
    if since:
        runs = runs.filter(queued_at__gte=_day_start(since))
    if until:
        runs = runs.filter(queued_at__lt=_day_start(until + timedelta(days=1)))
    key = sort.lstrip("-")
    field = SORTS.get(key, SORTS[DEFAULT_SORT.lstrip("-")])
    descending = sort.startswith("-") if key in SORTS else True
    # Nulls (not finished yet) last in both directions; the id breaks ties, so pages never overlap.
    order = F(field).desc(nulls_last=True) if descending else F(field).asc(nulls_last=True)
    return runs.order_by(order, "-pk" if descending else "pk")


def usd_per_mtok(run: Run) -> Decimal | None:
    return run.cost_usd / Decimal(run.tokens) * Decimal(1_000_000) if run.tokens else None


RUN_CSV_HEADER = [
    "run_id",
    "team",
    "experiment",
    "arm",
    "status",
    "kind",
    "git_sha",
    "queued_at",
    "started_at",
    "finished_at",
    "steps",
    "tokens",
    "device_hours",
    "energy_kwh",
    "energy_estimated",
    "cost_usd",
    "unpriced_s",
    "usd_per_1m_tokens",
    "g_co2e",
    "carbon_method",
    "carbon_band",
]


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value else ""


def runs_csv_rows(runs: QuerySet[Run]) -> Iterator[list]:
    """The header, then one row per run; streamed in chunks, never the whole table in memory."""
    yield RUN_CSV_HEADER
    for run in runs.iterator(chunk_size=2000):
        per_mtok = usd_per_mtok(run)
        carbon = carbon_shown(
            breakdown=run.cost_breakdown,
            gpu_count=run.gpu_count,
            energy_estimated=run.energy_estimated,
            energy_j=run.energy_j,
            wall_s=run.device_seconds,
        )
        yield [
            run.pk,
            run.experiment.tenant.name,
            run.experiment.name,
            run.arm.name,
            run.status,
            run.kind,
            run.git_sha,
            _iso(run.queued_at),
            _iso(run.started_at),
            _iso(run.finished_at),
            run.steps,
            run.tokens,
            f"{run.device_seconds / 3600:.6f}",
            f"{run.energy_j / 3.6e6:.6f}",
            "estimated" if run.energy_estimated else "measured",
            f"{run.cost_usd:.6f}",
            _csv_value((run.cost_breakdown or {}).get("unpriced_s") or None),
            "" if per_mtok is None else f"{per_mtok:.6f}",
            ("unmeasured" if carbon.get("unmeasured") else "unpriced")
            if carbon["g_co2e"] is None
            else f"{carbon['g_co2e']:.3f}",
            carbon["method"],
            "" if carbon["band"] is None else f"{carbon['band']:g}",
        ]


# ---------------------------------------------------------------------------------------------
# The experiment comparison as CSV
# ---------------------------------------------------------------------------------------------
def comparison_csv_rows(*, experiment: Experiment) -> Iterator[list]:
    """One row per arm of experiment_report, as the comparison table shows it. Names carry
    their units (total_usd, energy_kwh, usd_per_mtok ...); energy_estimated flags modelled
    energy, and the projected.* columns (one run of target_steps) are estimates
    (projected.estimated says so). The quality columns come last, as the page's quality table
    shows them (apps.dashboard.quality: usd_to_target (est.), "not reached" where no run got
    there)."""
    report = experiment_report(experiment=experiment)
    rows = []
    for arm in report.arms:
        flat: dict = {}
        _flatten("", dataclasses.asdict(arm), flat)
        for key in [k for k in flat if k.split(".")[0] in (*QUALITY_FIELDS, "unpriced")]:
            flat.pop(key)
        flat.pop("arm_id")
        # Usage billed with no price, by component: always a column ({} where every second was
        # priced), so a pipeline reading it never misses an unpriced arm.
        flat["unpriced_s"] = arm.unpriced
        rows.append((flat, quality_csv_values(arm, report)))
    columns = list(dict.fromkeys(key for row, _ in rows for key in row)) or ["name"]
    yield ["experiment", *columns, *quality_csv_columns(report)]
    for row, quality in rows:
        yield [
            experiment.name,
            *(_csv_value(row.get(c)) for c in columns),
            *(_csv_value(v) for v in quality),
        ]


def _csv_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value, default=str)
    return str(value)


# ---------------------------------------------------------------------------------------------
# Compare 2-4 runs
# ---------------------------------------------------------------------------------------------
def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, inner, out)
    else:
        out[prefix] = value


def run_config(run: Run) -> dict:
    """The run's strategy as the runtime reads it (defaults filled in), flattened to dotted keys."""
    from gpu_runtime import StrategyError, load_strategy

    try:
        config = load_strategy(run.config_yaml).model_dump(mode="json")
    except StrategyError:
        return {"(unreadable strategy)": run.config_sha256}
    flat: dict = {}
    _flatten("", config, flat)
    return flat


@dataclass(frozen=True)
class ConfigRow:
    key: str
    values: list
    differs: bool


def config_diff(runs: list[Run]) -> list[ConfigRow]:
    """Every key of the runs' strategies; the ones whose values differ first, then the rest."""
    configs = [
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in run_config(r).items()}
        for r in runs
    ]
    keys = sorted(set().union(*configs))
    rows = [
        ConfigRow(k, [c.get(k, "—") for c in configs], len({c.get(k, "—") for c in configs}) > 1)
        for k in keys
    ]
    return [r for r in rows if r.differs] + [r for r in rows if not r.differs]


BREAKDOWN_TERMS = (
    ("gpu_usd", "device-hours"),
    ("energy_usd", "energy"),
    ("cpu_usd", "vCPU"),
    ("memory_usd", "memory"),
    ("tiered_usd", "tiered (per unit)"),
    ("used_usd", "device time used"),
    ("idle_usd", "device time idle"),
)


def cost_rows(runs: list[Run]) -> list[tuple[str, list]]:
    """The cost breakdown side by side: one row per term any run has, USD."""
    rows = [
        (label, [(r.cost_breakdown or {}).get(key) for r in runs])
        for key, label in BREAKDOWN_TERMS
        if any(key in (r.cost_breakdown or {}) for r in runs)
    ]
    rows.append(("total", [r.cost_usd for r in runs]))
    rows.append(("per 1M tokens", [usd_per_mtok(r) for r in runs]))
    return rows


def runs_compare(*, user, ids: list[int]) -> dict:
    """2-4 of the user's runs side by side: config diff, cost breakdown, overlaid telemetry
    charts."""
    runs = list(runs_visible(user=user).filter(pk__in=ids).order_by("pk"))
    series = run_series(
        runs=runs, fields=charts.RUN_FIELDS, budget=charts.budget_per_run(len(runs))
    )
    arm_ids = list(dict.fromkeys(r.arm_id for r in runs))
    names = {r.arm_id: f"{r.experiment.name} / {r.arm.name}" for r in runs}
    return {
        "runs": runs,
        "config": config_diff(runs),
        "costs": cost_rows(runs),
        "charts": {
            "cursor": charts.epoch_ms(timezone.now()),
            "poll_ms": charts.LIVE_POLL_MS,
            "arms": {
                str(a): {"name": names[a], "color": charts.arm_color(i), "control": False}
                for i, a in enumerate(arm_ids)
            },
            "telemetry": charts.telemetry_json(
                runs=runs,
                arm_names={r.arm_id: r.arm.name for r in runs},
                series=series,
                fields=charts.RUN_FIELDS,
            ),
        },
    }


# ---------------------------------------------------------------------------------------------
# Spend against the monthly budget
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TenantSpend:
    tenant: Tenant
    month: date
    spent_usd: Decimal
    budget_usd: Decimal
    active_runs: int
    max_concurrent_runs: int
    by_arm: list[dict]  # experiment, arm, runs, cost_usd, estimated

    @property
    def budget_share(self) -> float | None:
        return float(self.spent_usd / self.budget_usd) if self.budget_usd else None


def month_start(day: date) -> datetime:
    return _day_start(day.replace(day=1))


def _next_month(start: datetime) -> datetime:
    return (start + timedelta(days=32)).replace(day=1)


def spend_overview(*, user, month: date | None = None) -> dict:
    """Per tenant of the user, for one calendar month (UTC): spend per experiment and arm, per day
    and cumulative, against the monthly budget, with the run quota. Spend is counted as the budget
    check counts it (apps.experiments.services): the cost of runs queued in the month."""
    start = month_start(month or timezone.now().date())
    end = _next_month(start)
    tenants = list(tenants_of(user=user))
    month_runs = Run.objects.filter(tenant__in=tenants, queued_at__gte=start, queued_at__lt=end)
    money = DecimalField(max_digits=16, decimal_places=6)
    by_arm = list(
        month_runs.values("tenant_id", "experiment_id", "experiment__name", "arm_id", "arm__name")
        .annotate(
            runs=Count("pk"),
            cost_usd=Coalesce(Sum("cost_usd"), Decimal(0), output_field=money),
            estimated=Count("pk", filter=Q(energy_estimated=True)),
        )
        .order_by("tenant_id", "experiment__name", "arm__name")
    )
    daily = list(
        month_runs.annotate(day=TruncDate("queued_at", tzinfo=timezone.get_current_timezone()))
        .values("tenant_id", "experiment_id", "arm_id", "day")
        .annotate(cost_usd=Coalesce(Sum("cost_usd"), Decimal(0), output_field=money))
        .order_by("day")
    )
    active = dict(
        Run.objects.filter(tenant__in=tenants, status__in=Run.ACTIVE_STATUSES)
        .values("tenant_id")
        .annotate(n=Count("pk"))
        .values_list("tenant_id", "n")
    )
    out, chart = [], {}
    colours = charts.arm_color_indices(experiment_ids={row["experiment_id"] for row in by_arm})
    for tenant in tenants:
        arms = [row for row in by_arm if row["tenant_id"] == tenant.pk]
        budget = tenant.monthly_budget_usd
        for row in arms:
            row["share"] = float(row["cost_usd"] / budget) if budget else None
        spent = sum((row["cost_usd"] for row in arms), Decimal(0))
        out.append(
            TenantSpend(
                tenant=tenant,
                month=start.date(),
                spent_usd=spent,
                budget_usd=tenant.monthly_budget_usd,
                active_runs=active.get(tenant.pk, 0),
                max_concurrent_runs=tenant.max_concurrent_runs,
                by_arm=arms,
            )
        )
        chart[str(tenant.pk)] = _spend_chart(
            tenant, arms, [d for d in daily if d["tenant_id"] == tenant.pk], start, end, colours
        )
    return {
        "month": start.date(),
        "previous": (start - timedelta(days=1)).date().replace(day=1),
        "next": end.date() if end <= month_start(timezone.now().date()) else None,
        "tenants": out,
        "chart": chart,
    }


def _spend_chart(
    tenant: Tenant,
    arms: list[dict],
    daily: list[dict],
    start: datetime,
    end: datetime,
    colours: dict[int, int],
) -> dict:
    """Cumulative spend per arm over the month's days (stacked by the page) and the budget line;
    each arm in the colour the experiment page gives it."""
    days = [(start + timedelta(days=i)).date() for i in range((end - start).days)]
    today = timezone.now().date()
    shown = [d for d in days if d <= today] or days[:1]
    labels = {
        (a["experiment_id"], a["arm_id"]): f"{a['experiment__name']} / {a['arm__name']}"
        for a in arms
    }
    per_day: dict = {}
    for row in daily:
        per_day.setdefault((row["experiment_id"], row["arm_id"]), {})[row["day"]] = float(
            row["cost_usd"]
        )
    traces = []
    for key, label in labels.items():
        total, ys = 0.0, []
        for d in shown:
            total += per_day.get(key, {}).get(d, 0.0)
            ys.append(round(total, 6))
        traces.append(
            {
                "name": label,
                "color": charts.arm_color(colours.get(key[1], 0)),
                "x": [d.isoformat() for d in shown],
                "y": ys,
            }
        )
    return {
        "tenant": tenant.name,
        "budget_usd": float(tenant.monthly_budget_usd),
        "x_range": [days[0].isoformat(), days[-1].isoformat()],
        "traces": traces,
    }
