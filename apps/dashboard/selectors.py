"""Reads of the dashboard, always scoped to the signed-in user's tenants (their Memberships).

Every page is a constant number of queries, whatever the number of experiments, arms, runs or
samples: lists annotate in SQL, charts come from apps.dashboard.series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import PurePosixPath

from django.conf import settings
from django.db.models import (
    Case,
    Count,
    IntegerField,
    JSONField,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.attribution.models import AttributionWindow
from apps.attribution.reads import ExperimentReport, experiment_report
from apps.dashboard import charts, training, verdict_card, verdicts
from apps.dashboard.quality import quality_row
from apps.dashboard.series import live_series, run_series
from apps.dashboard.templatetags.dashboard_format import confidence
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.runs import ARTIFACT_HASHES, run_artifacts_listed
from apps.experiments.selectors import queue_places, run_outliers
from apps.pricing.models import GpuPrice, PricingTable
from apps.telemetry.diagnosis import run_kernel_diagnosis
from apps.telemetry.evaluations import run_evaluation_summary
from apps.telemetry.selectors import telemetry_by_rank
from apps.tenants.models import Membership, Tenant

# Runs listed on an experiment's page, and runs drawn on its charts (running ones first).
RECENT_RUNS = 20
CHART_RUNS = 12
# A run queued this long with no worker heartbeat anywhere means no worker is consuming the queue.
QUEUE_GRACE_S = 20.0


@dataclass(frozen=True)
class Notice:
    """An empty state or a problem, said so a person knows what is going on and what to do."""

    level: str  # info | warning
    title: str
    text: str


def tenants_of(*, user) -> QuerySet[Tenant]:
    return Tenant.objects.filter(
        pk__in=Membership.objects.filter(user=user).values("tenant_id")
    ).order_by("name")


def token_tenants(*, user) -> list[Tenant]:
    """The tenants whose API tokens the user manages: those they administer (staff: every one
    they belong to), as /api/v1/tokens/ allows."""
    memberships = Membership.objects.filter(user=user)
    if not user.is_staff:
        memberships = memberships.filter(role=Membership.Role.ADMIN)
    return list(Tenant.objects.filter(pk__in=memberships.values("tenant_id")).order_by("name"))


def experiments_visible(*, user) -> QuerySet[Experiment]:
    """Experiments of the user's tenants; anything else is a 404 to them."""
    return Experiment.objects.filter(
        tenant__in=Membership.objects.filter(user=user).values("tenant_id")
    ).select_related("tenant", "cost_model")


def runs_visible(*, user) -> QuerySet[Run]:
    return Run.objects.filter(
        tenant__in=Membership.objects.filter(user=user).values("tenant_id")
    ).select_related("arm", "experiment__tenant", "gpu_sku")


# ---------------------------------------------------------------------------------------------
# Experiments list
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExperimentRow:
    experiment: Experiment
    arms: list[Arm]
    frozen: list[Arm]
    spend_usd: Decimal
    spend_estimated: bool
    runs: int
    running: int
    queued: int
    last_attribution: datetime | None
    last_attribution_skipped: bool
    verdicts: list  # verdicts.Verdict per non-control arm, at the latest window


def experiment_rows(*, user) -> list[ExperimentRow]:
    """State, arms, verdicts, spend to date, last attribution and frozen arms of each visible
    experiment.
    Four queries, whatever the number of experiments."""
    last = AttributionWindow.objects.filter(experiment=OuterRef("pk")).order_by("-number")
    experiments = (
        experiments_visible(user=user)
        .annotate(
            spend=Coalesce(Sum("runs__cost_usd"), Value(Decimal(0))),
            run_count=Count("runs"),
            running=Count("runs", filter=Q(runs__status=Run.Status.RUNNING)),
            queued=Count("runs", filter=Q(runs__status=Run.Status.QUEUED)),
            estimated=Count("runs", filter=Q(runs__energy_estimated=True)),
            last_end=Subquery(last.values("window_end")[:1]),
            last_status=Subquery(last.values("status")[:1]),
        )
        .prefetch_related(Prefetch("arms", queryset=Arm.objects.order_by("-is_control", "name")))
        .order_by("tenant__name", "-created_at", "-pk")
    )
    experiments = list(experiments)
    verdicts_of = verdicts.experiments_verdicts(experiments=experiments)
    return [
        ExperimentRow(
            experiment=e,
            verdicts=verdicts_of[e.pk],
            arms=list(e.arms.all()),
            frozen=[a for a in e.arms.all() if a.state == Arm.State.FROZEN],
            spend_usd=e.spend,
            spend_estimated=e.estimated > 0,
            runs=e.run_count,
            running=e.running,
            queued=e.queued,
            last_attribution=e.last_end,
            last_attribution_skipped=e.last_status == AttributionWindow.Status.SKIPPED,
        )
        for e in experiments
    ]


# ---------------------------------------------------------------------------------------------
# Experiment page
# ---------------------------------------------------------------------------------------------
@dataclass
class ExperimentPage:
    experiment: Experiment
    parts: dict  # what the page refreshes while runs train: experiment_parts()
    charted_runs: int
    charts: dict = field(default_factory=dict)
    arm_settings: list[ArmSettings] = field(default_factory=list)


@dataclass(frozen=True)
class ResolvedRow:
    """One `auto` key of a run's strategy and what it became on the run's device."""

    key: str
    requested: str
    chosen: str  # as the strategy's YAML would write it: bf16, 1, false
    why: str
    outcome: str = ""  # what happened while training (kernels.compile: compiled, loaded, eager)


def resolved_rows(resolved: dict) -> list[ResolvedRow]:
    """A run's `resolved` ({key: {requested, resolved, why}}) as the pages list it, by key (a
    jsonb column keeps no order)."""
    return [
        ResolvedRow(
            key=key,
            requested=_yaml_value(choice.get("requested", "auto")),
            chosen=_yaml_value(choice.get("resolved")),
            why=choice.get("why", ""),
            outcome=compile_outcome(choice),
        )
        for key, choice in sorted((resolved or {}).items())
    ]


def compile_outcome(choice: dict) -> str:
    """kernels.compile as the run ended (workers.training records it): compiled, loaded from the
    cache or eager, the seconds it took, and whether the figures it decided on were estimated."""
    mode = choice.get("mode")
    if not mode:
        return ""
    seconds = choice.get("compile_s")
    took = "" if seconds is None else f" in {seconds:.1f} s"
    cache = {"hit": "a cache hit", "miss": "a cache miss", "partial": "partly from the cache"}
    if mode == "loaded":
        said = f"loaded from the compile cache{took}"
    elif mode == "compiled":
        said = f"compiled{took}" + (
            f" ({cache[choice['cache']]})" if choice.get("cache") in cache else ""
        )
    elif mode == "fell back to eager":
        said = f"fell back to eager: {choice.get('fallback') or 'no reason recorded'}"
    else:
        said = "eager: not compiled"
    speedup = choice.get("measured_speedup")
    if speedup:
        said += f"; compiled steps measured {speedup:.2f}x eager"
    if choice.get("estimated"):
        said += "; decided on estimated compile figures (none learned yet)"
    where = choice.get("cache_where") or ""
    if mode != "eager" and where.startswith("Redis unreachable"):
        said += f"; {where}"
    return said


def _yaml_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class ArmSettings:
    """An arm's strategy as written, and what its `auto` keys became on the device of its latest
    run that says (run_id None: no run has started yet)."""

    arm: Arm
    run_id: int | None
    resolved: list[ResolvedRow]


def _arms_with_latest_resolved(experiment: Experiment) -> QuerySet[Arm]:
    """The experiment's arms in colour order, each with its latest started run's resolved `auto`
    keys: in the arms' own query (no query per arm)."""
    latest = Run.objects.filter(arm=OuterRef("pk")).exclude(resolved={}).order_by("-pk")
    return experiment.arms.order_by("-is_control", "name").annotate(
        resolved_run_id=Subquery(latest.values("pk")[:1]),
        latest_resolved=Subquery(latest.values("resolved")[:1], output_field=JSONField()),
    )


@dataclass(frozen=True)
class RunStats:
    counts: dict[str, int]
    oldest_queued: datetime | None
    stalest_heartbeat: datetime | None  # of the running runs


def _run_stats(experiment: Experiment) -> RunStats:
    rows = (
        Run.objects.filter(experiment=experiment)
        .values("status")
        .order_by("status")
        .annotate(n=Count("pk"), queued_at=Min("queued_at"), heartbeat=Min("heartbeat_at"))
    )
    by_status = {r["status"]: r for r in rows}
    return RunStats(
        counts={s: r["n"] for s, r in by_status.items()},
        oldest_queued=by_status.get(Run.Status.QUEUED, {}).get("queued_at"),
        stalest_heartbeat=by_status.get(Run.Status.RUNNING, {}).get("heartbeat"),
    )


def _queue_stats(queue: str) -> RunStats:
    """Every queued worker run of a queue (whoever's), and the oldest: what a queued run's page
    says it waits behind (one query)."""
    row = Run.objects.filter(
        queue=queue, status=Run.Status.QUEUED, kind=Run.Kind.WORKER, cancel_requested=False
    ).aggregate(n=Count("pk"), oldest=Min("queued_at"))
    return RunStats({Run.Status.QUEUED: row["n"]}, row["oldest"], None)


def worker_notices(*, stats: RunStats, now: datetime) -> list[Notice]:
    """Queued runs nobody picks up, or running runs whose worker stopped reporting."""
    out = []
    lease_s = settings.COSTLAB_RUN_LEASE_S
    queued = stats.counts.get(Run.Status.QUEUED, 0)
    if (
        queued
        and stats.oldest_queued
        and (now - stats.oldest_queued).total_seconds() > QUEUE_GRACE_S
    ):
        waited = _ago(now - stats.oldest_queued)
        alive = Run.objects.filter(
            status=Run.Status.RUNNING, heartbeat_at__gte=now - timedelta(seconds=lease_s)
        )
        if alive.exists():
            out.append(
                Notice(
                    "info",
                    "Workers are busy",
                    f"{queued} run(s) queued, the oldest for {waited}: every worker is training "
                    "another run. They start as soon as one is free.",
                )
            )
        else:
            out.append(
                Notice(
                    "warning",
                    "Worker offline",
                    f"{queued} run(s) queued, the oldest for {waited}, and no worker has reported "
                    f"a heartbeat in the last {lease_s:.0f} s. Start one (`make run` starts web, "
                    "worker and beat; with Docker Compose, the `worker` service).",
                )
            )
    if stats.stalest_heartbeat and (now - stats.stalest_heartbeat).total_seconds() > lease_s:
        out.append(
            Notice(
                "warning",
                "A running run stopped reporting",
                f"A worker last reported {_ago(now - stats.stalest_heartbeat)} ago. Its run will "
                "be marked lost and retried by the sweeper (celery beat).",
            )
        )
    return out


def attribution_notices(
    *,
    experiment: Experiment,
    report: ExperimentReport,
    stats: RunStats,
    last_window: AttributionWindow | None,
) -> list[Notice]:
    out = []
    if not stats.counts:
        out.append(
            Notice(
                "info",
                "No runs yet",
                "Submit one with the CLI "
                f"(`costlab submit --experiment {experiment.pk} --strategy FILE.yaml`) or the API "
                "(`POST /api/v1/runs/`). Charts and costs fill in as soon as a worker reports "
                "telemetry.",
            )
        )
    if experiment.status != Experiment.Status.ACTIVE:
        out.append(
            Notice(
                "info",
                f"Experiment is {experiment.get_status_display().lower()}",
                "Attribution and freezes only run while an experiment is active.",
            )
        )
    elif last_window is None and any(a.runs for a in report.arms):
        out.append(
            Notice(
                "info",
                "Attribution not yet run",
                "Costs below are measured; the comparison with the control, its confidence "
                "bounds and freezes start at the first attribution, due within "
                f"{experiment.attribution_interval_s} s of priced telemetry. It runs on celery "
                "beat: if this stays, check that beat is running.",
            )
        )
    elif last_window is None and stats.counts:
        out.append(
            Notice(
                "info",
                "Attribution not yet run",
                "No run has reported priced telemetry yet, so there is nothing to attribute.",
            )
        )
    if last_window is not None and last_window.status == AttributionWindow.Status.SKIPPED:
        out.append(
            Notice(
                "warning",
                f"Latest attribution (at {timezone.localtime(last_window.window_end):%H:%M}) "
                "was skipped",
                last_window.skip_reason,
            )
        )
    return out


def _ago(delta: timedelta) -> str:
    s = int(delta.total_seconds())
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h"


def _charted_runs(experiment: Experiment) -> list[Run]:
    running_first = Case(
        When(status=Run.Status.RUNNING, then=Value(0)),
        default=Value(1),
        output_field=IntegerField(),
    )
    return list(
        Run.objects.filter(experiment=experiment, last_seq__gte=0)
        .annotate(running_first=running_first)
        .order_by("running_first", "-pk")[:CHART_RUNS]
    )


def experiment_page(*, experiment: Experiment, now: datetime | None = None) -> ExperimentPage:
    """Everything the experiment page shows: the verdicts, the comparison, runs, notices and every
    chart's data."""
    now = now or timezone.now()
    arms = list(_arms_with_latest_resolved(experiment))
    parts = experiment_parts(experiment=experiment, now=now, arm_ids=[a.pk for a in arms])
    arm_names = {a.arm_id: a.name for a in parts["report"].arms}
    colors = parts["arm_colors"]
    charted = _charted_runs(experiment)
    series = run_series(
        runs=charted, fields=charts.EXPERIMENT_FIELDS, budget=charts.budget_per_run(len(charted))
    )
    return ExperimentPage(
        experiment=experiment,
        parts=parts,
        charted_runs=len(charted),
        charts={
            "cursor": charts.epoch_ms(now),
            "poll_ms": charts.LIVE_POLL_MS,
            "arms": {
                str(a.pk): {
                    "name": a.name,
                    "color": charts.ARM_COLORS[colors[a.pk]],
                    "control": a.is_control,
                }
                for a in arms
            },
            "telemetry": charts.telemetry_json(
                runs=charted, arm_names=arm_names, series=series, fields=charts.EXPERIMENT_FIELDS
            ),
            "attribution": charts.attribution_json(experiment=experiment, arms=arms, now=now),
        },
        arm_settings=[
            ArmSettings(arm=a, run_id=a.resolved_run_id, resolved=resolved_rows(a.latest_resolved))
            for a in arms
        ],
    )


def experiment_parts(
    *, experiment: Experiment, now: datetime | None = None, arm_ids: list[int] | None = None
) -> dict:
    """The parts of the experiment page that move while runs train, rendered on the page and again
    by the fragment the page fetches (dashboard/_experiment_parts.html): the verdict card, the run
    counts, the comparison tables (cost, quality) with their notices and the quality chart's data,
    and the recent runs."""
    now = now or timezone.now()
    report = experiment_report(experiment=experiment)
    stats = _run_stats(experiment)
    if arm_ids is None:  # in colour order: the control first, then by name
        arm_ids = list(experiment.arms.order_by("-is_control", "name").values_list("pk", flat=True))
    outliers = run_outliers(experiment_id=experiment.pk)
    card = verdict_card.experiment_card(experiment=experiment, now=now, outliers=outliers)
    verdict_list, last_window = card.verdicts, card.window
    colors = {pk: i % len(charts.ARM_COLORS) for i, pk in enumerate(arm_ids)}
    arm_report = {a.arm_id: a for a in report.arms}
    sure = confidence(experiment.alpha)
    return {
        "experiment": experiment,
        "report": report,
        "arm_report": arm_report,
        "last_window": last_window,
        "arm_colors": colors,
        "quality_of": {a.arm_id: quality_row(a, target=report.quality_target) for a in report.arms},
        # drawn by charts.js from the page, redrawn from each refresh of these parts
        "quality_chart": charts.quality_json(
            experiment=experiment,
            target=report.quality_target,
            colors={pk: charts.ARM_COLORS[i] for pk, i in colors.items()},
            arm_names={a.arm_id: a.name for a in report.arms},
            arm_order=arm_ids,
        ),
        "verdicts": verdict_list,
        "verdict_of": {v.arm_id: v for v in verdict_list},
        # the card's carbon line per arm, in the cost's words (never a result before cost is)
        "carbon_of": {
            v.arm_id: verdict_card.carbon_line(
                arm=arm_report[v.arm_id], control_name=v.control, verdict=v, sure=sure
            )
            for v in verdict_list
            if v.arm_id in arm_report
        },
        "sure": sure,
        "run_counts": stats.counts,
        "recent_runs": list(experiment.runs.select_related("arm").order_by("-pk")[:RECENT_RUNS]),
        "outlier_ids": set(outliers),
        "notices": attribution_notices(
            experiment=experiment, report=report, stats=stats, last_window=last_window
        )
        + worker_notices(stats=stats, now=now),
    }


def _live_runs(runs: QuerySet[Run], now: datetime) -> list[Run]:
    recent = now - timedelta(seconds=60)
    return list(
        runs.filter(
            Q(status=Run.Status.RUNNING) | Q(finished_at__gte=recent) | Q(heartbeat_at__gte=recent)
        )
        .select_related("arm")
        .order_by("-pk")[: CHART_RUNS * 2]
    )


def live_update(
    *,
    runs: QuerySet[Run],
    since: datetime,
    now: datetime | None = None,
    fields: tuple[str, ...] = charts.EXPERIMENT_FIELDS,
) -> dict:
    """New samples of the runs training now (or just finished) since the cursor, and the next
    cursor."""
    now = now or timezone.now()
    live = _live_runs(runs, now)
    series = live_series(runs=live, fields=fields, since=since)
    names = {r.arm_id: r.arm.name for r in live}
    return {
        "cursor": charts.epoch_ms(now),
        "active": bool(live),
        "runs": charts.runs_json(live, names, series),
        "series": series.as_json(fields),
        "progress": series.progress_json(),
    }


def experiment_live(
    *, experiment: Experiment, since: datetime, known_version: str, now: datetime | None = None
) -> dict:
    """A poll of the experiment page: new samples, and the attribution charts when they changed."""
    now = now or timezone.now()
    update = live_update(runs=Run.objects.filter(experiment=experiment), since=since, now=now)
    version = charts.attribution_version(experiment=experiment)
    update["attribution"] = None
    if version != known_version:
        arms = list(experiment.arms.order_by("-is_control", "name"))
        update["attribution"] = charts.attribution_json(
            experiment=experiment, arms=arms, now=now, version=version
        )
    return update


# ---------------------------------------------------------------------------------------------
# Run page
# ---------------------------------------------------------------------------------------------
def _strategy_of(run: Run):
    """The run's strategy as the runtime reads it; None when it no longer validates."""
    from gpu_runtime import StrategyError, load_strategy

    try:
        return load_strategy(run.config_yaml)
    except StrategyError:
        return None


def _device_facts(run: Run, config) -> None:
    """What the run page says of the hardware: its class in words, the strategy's dtype (auto or
    named), and the profile's GFLOP/s per float dtype."""
    from apps.devices.selectors import device_class_label

    run.device_class_label = device_class_label(run.device_class)
    run.strategy_compute_dtype = "" if config is None else config.precision.compute_dtype
    profile = run.device_measurement.profile if run.device_measurement_id else {}
    run.profile_dtypes = [
        {"dtype": name, **row}
        for name, row in (profile.get("dtypes") or {}).items()
        if name != "int8" and row.get("gflops") is not None
    ]


@dataclass(frozen=True)
class RunModel:
    """The model line of the run page: what the strategy trained, and how."""

    family: str  # llama (costlab's own, from a preset) | hf (a local checkpoint)
    name: str  # the preset, or the checkpoint's directory name
    method: str  # finetune.method: full | lora
    lora: str = ""  # "r 8, alpha 16" for a LoRA fine-tune
    saves: bool = False  # finetune.save
    from_checkpoint: bool = False  # train.init checkpoint: a fine-tune, not training from scratch


def run_model(config) -> RunModel | None:
    """The strategy's model in a few words (None: the strategy no longer validates)."""
    if config is None:
        return None
    model, finetune = config.model, config.finetune
    name = model.preset
    if model.family == "hf":
        name = PurePosixPath(str(model.path).replace("\\", "/").rstrip("/")).name or model.path
    lora = f"r {finetune.r}, alpha {finetune.alpha:g}" if finetune.method == "lora" else ""
    from_checkpoint = config.train.starts_from(model.family) == "checkpoint"
    return RunModel(model.family, name, finetune.method, lora, finetune.save, from_checkpoint)


@dataclass(frozen=True)
class RunParams:
    total: int
    trainable: int | None

    @property
    def trainable_pct(self) -> float | None:
        if self.trainable is None or not self.total:
            return None
        return 100.0 * self.trainable / self.total

    @property
    def trainable_pct_text(self) -> str:
        """'0.8', '100.0'; a LoRA's tiny share keeps two figures ('0.034') rather than '0.0'."""
        share = self.trainable_pct
        if share is None:
            return ""
        return f"{share:.1f}" if share >= 0.1 or share == 0 else f"{share:.2g}"


def run_params(run: Run) -> RunParams | None:
    """The parameter counts the runtime reported (None: not reported, e.g. an external run)."""
    if run.params_total is None:
        return None
    return RunParams(total=run.params_total, trainable=run.params_trainable)


def run_artifacts(run: Run) -> list[dict]:
    """What the run saved (finetune.save), as the page lists it: kind, file name, size, and each
    hash with its short form."""
    return [
        {**row, **{f"{key}_short": row[key][:12] for key in ARTIFACT_HASHES}}
        for row in run_artifacts_listed(run)
    ]


def run_page(*, run: Run, now: datetime | None = None, against: Run | None = None) -> dict:
    """What the run's page shows; `against`: another run whose params the table is compared to."""
    now = now or timezone.now()
    metrics = training.training_metrics(run=run)
    series = run_series(runs=[run], fields=charts.RUN_FIELDS, budget=charts.RUN_BUDGET_MAX)
    notices = []
    if run.status == Run.Status.QUEUED:
        notices = worker_notices(stats=_queue_stats(run.queue), now=now)
    elif run.status == Run.Status.RUNNING and run.heartbeat_at:
        notices = worker_notices(stats=RunStats({}, None, run.heartbeat_at), now=now)
    if run.last_seq < 0 and run.status != Run.Status.QUEUED:
        notices.append(Notice("info", "No telemetry", "This run has not reported any telemetry."))
    if run.raw_dropped_before is not None:
        notices.append(
            Notice(
                "info",
                "Raw samples dropped",
                "Telemetry retention dropped this run's raw samples taken before "
                f"{run.raw_dropped_before:%Y-%m-%d %H:%M} UTC. Its bill and totals stand as "
                "billed; its charts come from the rolled-up blocks (64 samples each).",
            )
        )
    config = _strategy_of(run)
    _device_facts(run, config)
    place = None
    if run.status == Run.Status.QUEUED and run.kind == Run.Kind.WORKER:
        place = queue_places(queues={run.queue}).get(run.pk)
    memory = series.series[run.pk]["mem_used_mb"].hi  # from the chart's read: no extra scan
    colour = charts.arm_color_indices(experiment_ids=[run.experiment_id]).get(run.arm_id, 0)
    return {
        "run": run,
        "peak_mem_mb": max(memory) if memory else None,
        "evaluations": run_evaluation_summary(run_id=run.pk),
        "queue_place": place,
        "notices": notices,
        "breakdown": run.cost_breakdown or {},
        "attempts": list(run.attempt_log.all()),
        "model": run_model(config),
        "resolved": resolved_rows(run.resolved),
        "params": run_params(run),
        "artifacts": run_artifacts(run),
        "ranks": telemetry_by_rank(run=run) if run.world_size > 1 else [],
        "kernel": run_kernel_diagnosis(run=run),
        "training_metrics": metrics,
        "hyperparameters": training.hyperparameters(run=run, against=against),
        "charts": {
            "cursor": charts.epoch_ms(now),
            "poll_ms": charts.LIVE_POLL_MS,
            "arms": {
                str(run.arm_id): {
                    "name": run.arm.name,
                    "color": charts.arm_color(colour),
                    "control": False,
                }
            },
            "telemetry": charts.telemetry_json(
                runs=[run],
                arm_names={run.arm_id: run.arm.name},
                series=series,
                fields=charts.RUN_FIELDS,
            ),
            "cost": charts.cost_breakdown_json(run),
            "metrics": {"names": metrics["names"], "series": metrics["series"]},
        },
    }


# ---------------------------------------------------------------------------------------------
# Pricing
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TenantPricing:
    tenant: Tenant
    in_force: PricingTable | None
    upcoming: list[PricingTable]
    previous: list[PricingTable]


def pricing_overview(*, user, now: datetime | None = None) -> list[TenantPricing]:
    """Per tenant of the user: the pricing table in force now (with its GPU prices), and the
    others."""
    now = now or timezone.now()
    tenants = list(tenants_of(user=user))
    gpu_prices = GpuPrice.objects.select_related("sku").order_by("sku__name")
    all_tables = list(
        PricingTable.objects.filter(tenant__in=tenants)
        .order_by("-valid_from")
        .prefetch_related(Prefetch("gpu_prices", queryset=gpu_prices))
    )
    out = []
    for tenant in tenants:
        tables = [t for t in all_tables if t.tenant_id == tenant.pk]
        in_force = next((t for t in tables if t.valid_from <= now), None)
        out.append(
            TenantPricing(
                tenant=tenant,
                in_force=in_force,
                upcoming=[t for t in tables if t.valid_from > now][::-1],
                previous=[t for t in tables if t.valid_from <= now and t is not in_force],
            )
        )
    return out
