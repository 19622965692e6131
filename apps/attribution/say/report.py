"""The comparison per arm, as the design document tabulates it: measured so far, and projected
to the experiment's target number of steps with cost_engine.project."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

from django.db.models import Avg, Case, Count, F, FloatField, Q, Sum, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from apps.attribution.decide import stats
from apps.attribution.decide.quality import cost_to_target
from apps.attribution.evidence.comparison import Comparison
from apps.attribution.evidence.device_classes import ClassVerdict, class_verdicts
from apps.attribution.say.snapshots import policy_for
from apps.attribution.selectors import arm_repricing, quality_curves, snapshots_latest
from apps.billing.interface import (
    JOULES_PER_KWH,
    SECONDS_PER_HOUR,
    CostBreakdown,
    Projection,
    Usage,
    carbon_figure,
    carbon_method,
    carbon_unmeasured,
    cost_per_million_tokens,
    project,
)
from apps.experiments.models import Experiment, Run
from apps.pricing.models import CostModel


@dataclass(frozen=True)
class ArmReport:
    arm_id: int
    name: str
    is_control: bool
    state: str
    weight: Decimal
    runs: int
    runs_succeeded: int
    tokens: int
    steps: int
    gpu_hours: float
    energy_kwh: float
    energy_estimated: bool  # some energy was modelled, not measured: say so wherever it is shown
    electricity_usd: float  # the energy term as billed (PUE and cost-model weight included)
    total_usd: float  # as billed: each run at the tables in force while it ran
    compared_usd: (
        float  # the same usage at the report's one comparison table: what the figures below compare
    )
    usd_per_mtok: float | None
    metric: (
        str  # what deviation compares: usd_per_mtok, or usd_per_step for a tiered-per-step model
    )
    metric_value: float | None
    throughput_tok_s: float | None
    completion_s: float | None  # mean wall time of the arm's succeeded runs
    deviation: float | None  # measured now: (arm - control) / control on the metric
    deviation_low: float | None  # the always-valid bounds of the latest attribution window
    deviation_high: float | None
    projected: (
        Projection | None
    )  # one run of target_steps: GPU hours, electricity, total USD, completion
    # Carbon beside the dollars: as billed (each run at its versions' grid intensity; g_co2e,
    # method, band, low, high, unpriced), and compared (the arm's energy at the comparison
    # version's intensity) per 1M tokens, with its deviation from the control and the
    # always-valid bounds of that deviation over the arms' runs (apps.attribution.decide.stats).
    carbon: dict = field(default_factory=dict)
    compared_g_co2e: float | None = None
    gco2e_per_mtok: float | None = None
    carbon_deviation: float | None = None
    carbon_deviation_low: float | None = None
    carbon_deviation_high: float | None = None
    # What the latest attribution window counted for the arm (its epoch, its reference device
    # class, outliers left out where they are): the freeze rule's evidence, which the verdict
    # weighs against the experiment's minimums (apps.attribution.decide.verdict).
    evidence_runs: int = 0
    evidence_samples: int = 0
    # Quality beside cost (apps.attribution.decide.quality): the latest window's quality verdict
    # against the control (None before the first window), and the cost to the control's quality:
    # the mean USD the arm's finished runs took to reach the control's mean final value of the
    # metric (estimated: pro rata of each run's bill by wall time), of how many runs reached it.
    quality: dict | None = None
    usd_to_target: float | None = None
    runs_reached_target: int = 0
    runs_evaluated: int = 0
    # Seconds of usage billed with no price, by component (gpu, energy, vcpu, memory), summed over
    # the arm's runs, and the GPU SKUs without a price: an arm with any is never compared (its
    # verdict is `unpriced`), as a $0 line would make it look cheap.
    unpriced: dict = field(default_factory=dict)
    unpriced_skus: list = field(default_factory=list)


@dataclass(frozen=True)
class ExperimentReport:
    experiment_id: int
    name: str
    target_steps: int | None
    window_end: object  # the latest attribution window's end, or None before the first tick
    pricing_table: dict | None  # {id, valid_from}: the table every arm's usage is compared at
    arms: list[ArmReport]
    # The device class the arms' verdicts compare within, and one verdict per class
    # (apps.attribution.evidence.device_classes).
    device_class: str = ""
    device_classes: list[ClassVerdict] = field(default_factory=list)
    compared_on: str = "usd"  # what metric, metric_value and deviation compare: usd or gco2e
    quality_metric: str = "eval_loss"
    quality_direction: str = "lower"
    quality_margin: float = 0.01
    quality_target: float | None = None  # the control's mean final value: what cost-to is to


# A run's wall time as billed: a GPU run's device-seconds per device, a CPU run's wall seconds
# (a CPU DDP run's device-seconds per rank).
_WALL_S = Case(
    When(gpu_count__gt=0, then=F("device_seconds") / F("gpu_count")),
    When(world_size__gt=1, then=F("device_seconds") / F("world_size")),  # CPU DDP: summed per rank
    default=F("device_seconds"),
    output_field=FloatField(),
)
_SUCCEEDED_WORKER = Q(status=Run.Status.SUCCEEDED, kind=Run.Kind.WORKER)
_SUCCEEDED_EXTERNAL = Q(status=Run.Status.SUCCEEDED, kind=Run.Kind.EXTERNAL)


def _completion_s(r: dict) -> float | None:
    """Mean completion time of the succeeded runs: worker runs start to finish,
    external runs their telemetry span."""
    worker = (r.get("completed") or 0) if r.get("completion") is not None else 0
    external = (r.get("spanned") or 0) if r.get("span_s") is not None else 0
    if not worker + external:
        return None
    total = (r["completion"].total_seconds() * worker if worker else 0.0) + (
        r["span_s"] * external if external else 0.0
    )
    return total / (worker + external)


METRICS = ("usd", "gco2e")


def experiment_report(*, experiment: Experiment, metric: str = "usd") -> ExperimentReport:
    """Per arm: GPU hours, electricity USD, total USD, gCO2e, completion time, USD/1M tokens,
    deviation, state.

    metric "gco2e": metric, metric_value and deviation (with its bounds) compare gCO2e per unit of
    work instead of USD (the freeze rule compares USD either way).
    """
    if metric not in METRICS:
        raise ValueError(f"metric: one of {', '.join(METRICS)}, not {metric!r}")
    policy = policy_for(experiment)
    rows = _arm_rows(experiment, policy)
    latest = snapshots_latest(experiment=experiment)
    comparison = report_comparison(experiment=experiment, latest=latest)
    repriced = arm_repricing(experiment=experiment, comparison=comparison)
    compared = _compared_usd(rows, repriced)
    tiered = _tiered(experiment.cost_model)
    arms = list(experiment.arms.order_by("-is_control", "name"))
    unpriced_skus = _unpriced_skus(experiment)
    control = next((a for a in arms if a.is_control), None)
    target, to_target = _to_target(experiment, control)
    metric_of = _metric_values(rows, arms=arms, compared=compared, policy=policy)
    base = metric_of.get(control.pk) if control else None
    carbon = _carbon(
        rows, arms=arms, control=control, comparison=comparison, latest=latest, policy=policy
    )
    out = [
        _arm_report(
            arm,
            rows.get(arm.pk, {}),
            latest.get(arm.pk),
            experiment=experiment,
            policy=policy,
            compared_usd=compared.get(arm.pk, 0.0),
            value=metric_of[arm.pk],
            base=base,
            tiered=tiered,
            unpriced_skus=unpriced_skus.get(arm.pk, []),
            to_target=to_target.get(arm.pk, {}),
            carbon=carbon[arm.pk],
        )
        for arm in arms
    ]
    if metric == "gco2e":
        out = [_on_carbon(a, policy) for a in out]
    classes = class_verdicts(
        experiment=experiment,
        policy=policy,
        arms=arms,
        reference_report={a.arm_id: a for a in out},
    )
    if len(classes) > 1 and metric == "usd":
        # Several device classes: the point deviation is the reference class's alone, as the
        # bounds beside it are (the tick compares within it).
        out = _reference_class_deviations(out, classes)
    return ExperimentReport(
        experiment_id=experiment.pk,
        name=experiment.name,
        target_steps=experiment.target_steps,
        window_end=next(iter(latest.values())).window_end if latest else None,
        pricing_table=_pricing_table(comparison),
        arms=out,
        device_class=classes[0].device_class if classes else "",
        device_classes=classes,
        compared_on=metric,
        quality_metric=experiment.quality_metric,
        quality_direction=experiment.quality_direction,
        quality_margin=float(experiment.quality_margin),
        quality_target=target,
    )


def _arm_rows(experiment: Experiment, policy) -> dict[int, dict]:
    """Arm id -> its priced runs' totals, moments and counts, in one aggregate query."""
    units_f = Cast("steps" if policy.unit == "step" else "tokens", FloatField())
    return {
        r["arm_id"]: r
        for r in Run.objects.filter(experiment=experiment, priced_seq__gte=0)
        .values("arm_id")
        .order_by("arm_id")
        .annotate(
            # Run-level moments of (energy, units), the carbon deviation's bounds: first, before
            # the sums named energy_j, tokens and steps shadow the fields.
            energy_sq=Sum(F("energy_j") * F("energy_j"), output_field=FloatField()),
            energy_units=Sum(F("energy_j") * units_f, output_field=FloatField()),
            units_sq=Sum(units_f * units_f, output_field=FloatField()),
            runs=Count("pk"),
            runs_succeeded=Count("pk", filter=Q(status=Run.Status.SUCCEEDED)),
            tokens=Sum("tokens"),
            steps=Sum("steps"),
            energy_j=Sum("energy_j"),
            cost=Sum("cost_usd"),
            estimated=Count("pk", filter=Q(energy_estimated=True)),
            gpu_seconds=Sum(
                Case(
                    When(gpu_count__gt=0, then=F("device_seconds")),
                    default=Value(0.0),
                    output_field=FloatField(),
                )
            ),
            wall_s=Sum(_WALL_S),
            electricity=Sum(Cast(KT("cost_breakdown__energy_usd"), FloatField())),
            carbon=Sum(Cast(KT("cost_breakdown__carbon_g"), FloatField())),
            carbon_unpriced_s=Sum(Cast(KT("cost_breakdown__carbon_unpriced_s"), FloatField())),
            **{
                f"unpriced_{c}": Sum(Cast(KT(f"cost_breakdown__unpriced_s__{c}"), FloatField()))
                for c in UNPRICED_COMPONENTS
            },
            gpu_runs=Count("pk", filter=Q(gpu_count__gt=0)),
            completion=Avg(F("finished_at") - F("started_at"), filter=_SUCCEEDED_WORKER),
            completed=Count("pk", filter=_SUCCEEDED_WORKER),
            # An external run's submit and finish calls say nothing of how long it trained:
            # its telemetry span does (the billed wall time).
            span_s=Avg(_WALL_S, filter=_SUCCEEDED_EXTERNAL),
            spanned=Count("pk", filter=_SUCCEEDED_EXTERNAL),
        )
    }


def _compared_usd(rows: dict, repriced: dict) -> dict[int, float]:
    """Per arm, its usage at the comparison table: as billed plus the re-pricing's difference."""
    return {
        arm_id: float(r["cost"] or 0) + float(repriced.get(arm_id, 0)) for arm_id, r in rows.items()
    }


def _tiered(model: CostModel) -> dict:
    """The projection's tier arguments: a tiered-per-call model's tiers and unit, else none."""
    return (
        {"tiers": model.tiers, "unit": model.unit}
        if model.kind == CostModel.Kind.TIERED_PER_CALL
        else {}
    )


def _metric_values(rows: dict, *, arms: list, compared: dict, policy) -> dict[int, float | None]:
    """Per arm, the compared USD per unit of work at the policy's scale (None without usage)."""
    metric_of = {}
    for arm in arms:
        r = rows.get(arm.pk, {})
        units = (r.get("steps") or 0) if policy.unit == "step" else (r.get("tokens") or 0)
        metric_of[arm.pk] = (
            compared[arm.pk] / units * policy.scale if units and r.get("cost") else None
        )
    return metric_of


def _arm_report(
    arm,
    r: dict,
    snap,
    *,
    experiment: Experiment,
    policy,
    compared_usd: float,
    value: float | None,
    base: float | None,
    tiered: dict,
    unpriced_skus: list,
    to_target: dict,
    carbon: dict,
) -> ArmReport:
    """One arm's report from its aggregate row, its latest snapshot and the experiment's figures."""
    tokens, steps = int(r.get("tokens") or 0), int(r.get("steps") or 0)
    wall, total = float(r.get("wall_s") or 0), float(r.get("cost") or 0)
    cost, usage = _cost_and_usage(r, tokens=tokens, steps=steps, wall=wall, total=total)
    completion = _completion_s(r)
    return ArmReport(
        arm_id=arm.pk,
        name=arm.name,
        is_control=arm.is_control,
        state=arm.state,
        weight=arm.weight,
        runs=int(r.get("runs") or 0),
        runs_succeeded=int(r.get("runs_succeeded") or 0),
        tokens=tokens,
        steps=steps,
        gpu_hours=cost.gpu_hours,
        energy_kwh=cost.energy_kwh,
        energy_estimated=bool(r.get("estimated")),
        electricity_usd=cost.energy_usd,
        total_usd=total,
        compared_usd=compared_usd,
        usd_per_mtok=cost_per_million_tokens(compared_usd, tokens),
        metric=policy.metric,
        metric_value=value,
        throughput_tok_s=tokens / wall if wall > 0 else None,
        completion_s=completion,
        deviation=value / base - 1.0 if value is not None and base else None,
        deviation_low=snap.deviation_low if snap else None,
        deviation_high=snap.deviation_high if snap else None,
        quality=_quality_of(snap),
        unpriced={
            c: round(float(r[f"unpriced_{c}"]), 3)
            for c in UNPRICED_COMPONENTS
            if r.get(f"unpriced_{c}")
        },
        unpriced_skus=unpriced_skus,
        **to_target,
        evidence_runs=snap.runs if snap else 0,
        evidence_samples=snap.samples if snap else 0,
        projected=project(usage, cost, target_steps=experiment.target_steps, **tiered)
        if experiment.target_steps
        else None,
        **carbon,
    )


def _cost_and_usage(
    r: dict, *, tokens: int, steps: int, wall: float, total: float
) -> tuple[CostBreakdown, Usage]:
    """An arm's bill so far and the usage behind it, the inputs of its projection."""
    cost = CostBreakdown(
        energy_usd=float(r.get("electricity") or 0),
        total_usd=total,
        gpu_hours=float(r.get("gpu_seconds") or 0) / SECONDS_PER_HOUR,
        energy_kwh=float(r.get("energy_j") or 0) / JOULES_PER_KWH,
    )
    usage = Usage(
        wall_s=wall,
        device_seconds=float(r.get("gpu_seconds") or 0),
        energy_j=float(r.get("energy_j") or 0),
        tokens=tokens,
        steps=steps,
    )
    return cost, usage


def _reference_class_deviations(out: list[ArmReport], classes: list) -> list[ArmReport]:
    """Each arm's point deviation replaced by the reference device class's (classes[0])."""
    by_arm = {a.arm_id: a.deviation for a in classes[0].arms}
    return [replace(a, deviation=by_arm.get(a.arm_id)) for a in out]


def _pricing_table(comparison: Comparison) -> dict | None:
    """The comparison table as the report names it: {id, valid_from}, or None before a window."""
    return (
        {"id": comparison.table_id, "valid_from": comparison.valid_from}
        if comparison.table_id
        else None
    )


UNPRICED_COMPONENTS = ("gpu", "energy", "vcpu", "memory")
TARGET_TOLERANCE = 0.001  # relative: what "reached the control's quality" allows


def _unpriced_skus(experiment: Experiment) -> dict[int, list[str]]:
    """Per arm, the GPU SKUs its runs used with GPU time billed at no price."""
    rows = (
        Run.objects.filter(experiment=experiment, cost_breakdown__unpriced_s__has_key="gpu")
        .exclude(gpu_sku=None)
        .values_list("arm_id", "gpu_sku__name")
        .distinct()
        .order_by("arm_id", "gpu_sku__name")
    )
    out: dict[int, list[str]] = {}
    for arm_id, name in rows:
        out.setdefault(arm_id, []).append(name)
    return out


def _quality_of(snapshot) -> dict | None:
    q = ((snapshot.evidence or {}).get("quality") if snapshot else None) or None
    return None if q is None else {k: v for k, v in q.items() if k != "sums"}


def _to_target(experiment: Experiment, control) -> tuple[float | None, dict]:
    """The control's mean final value of the quality metric, and per arm the cost to reach it
    (ArmReport's usd_to_target, runs_reached_target, runs_evaluated)."""
    curves = [c for c in quality_curves(experiment=experiment) if c.finished and c.points]
    finals = [c.points[-1][1] for c in curves if control is not None and c.arm_id == control.pk]
    if not finals:
        return None, {}
    target = sum(finals) / len(finals)
    higher = experiment.quality_direction == "higher"
    # Reached within 0.1 % of the target: a run equal to the control's up to noise (bf16 against
    # fp32 at the fifth digit) would otherwise read "not reached" by chance.
    aim = target * (1 - TARGET_TOLERANCE if higher else 1 + TARGET_TOLERANCE)
    costs: dict[int, list] = {}
    for c in curves:
        costs.setdefault(c.arm_id, []).append(
            cost_to_target([(u, v) for u, v, _ in c.points], aim, higher_is_better=higher)
        )
    out = {}
    for arm_id, found in costs.items():
        hit = [x for x in found if x is not None]
        out[arm_id] = {
            "usd_to_target": sum(hit) / len(hit) if hit else None,
            "runs_reached_target": len(hit),
            "runs_evaluated": len(found),
        }
    return target, out


def _on_carbon(arm: ArmReport, policy) -> ArmReport:
    """The arm compared on gCO2e: metric, metric_value and deviation (with bounds) carbon's."""
    per_unit = arm.compared_g_co2e
    units = arm.steps if policy.unit == "step" else arm.tokens
    return replace(
        arm,
        metric="gco2e_per_step" if policy.unit == "step" else "gco2e_per_mtok",
        metric_value=per_unit / units * policy.scale if per_unit is not None and units else None,
        deviation=arm.carbon_deviation,
        deviation_low=arm.carbon_deviation_low,
        deviation_high=arm.carbon_deviation_high,
    )


def _carbon(
    rows: dict, *, arms: list, control, comparison: Comparison, latest: dict, policy
) -> dict:
    """Per arm, the ArmReport's carbon fields.

    Compared: the arm's energy x PUE x the comparison version's intensity (one version for every
    arm, as dollars are compared; before the first window, as billed). The deviation is taken on
    energy per unit of work, which one version's factor scales alike for every arm; its bounds
    are the always-valid interval of apps.attribution.decide.stats over the arms' runs (each run's
    cumulative energy and units), given min_cs_runs_per_arm runs per arm.
    """
    factor = None  # gCO2e per joule at the comparison version
    table = next((s.pricing_table for s in latest.values()), None)
    if comparison.table_id is not None and table is not None:
        if table.carbon_g_per_kwh is not None:
            factor = float(table.pue) * float(table.carbon_g_per_kwh) / JOULES_PER_KWH
    out, per_unit, estimates = {}, {}, {}
    for arm in arms:
        r = rows.get(arm.pk, {})
        runs, energy = int(r.get("runs") or 0), float(r.get("energy_j") or 0)
        units = (r.get("steps") or 0) if policy.unit == "step" else (r.get("tokens") or 0)
        # CPU and GPU runs mixed: rapl's wider band.
        gpu = runs > 0 and r.get("gpu_runs") == runs
        method = carbon_method(estimated=bool(r.get("estimated")), gpu=gpu)
        unpriced = bool(r.get("carbon_unpriced_s"))
        billed = float(r.get("carbon") or 0.0) if runs else None
        if comparison.table_id is None:
            compared = None if unpriced else billed
        else:
            compared = energy * factor if factor is not None and runs else None
        unmeasured = runs > 0 and energy <= 0 and float(r.get("wall_s") or 0) > 0
        if unmeasured and not r.get("estimated"):  # neither energy nor power: not 0 g
            compared = None
        out[arm.pk] = {
            "carbon": carbon_unmeasured(unpriced=unpriced)
            if unmeasured and not r.get("estimated")
            else carbon_figure(billed, method=method, unpriced=unpriced),
            "compared_g_co2e": None if compared is None else round(compared, 6),
            "gco2e_per_mtok": compared / r["tokens"] * 1e6
            if compared is not None and r.get("tokens")
            else None,
            "carbon_deviation": None,
            "carbon_deviation_low": None,
            "carbon_deviation_high": None,
        }
        per_unit[arm.pk] = compared / units if compared is not None and units else None
        estimates[arm.pk] = stats.ratio_estimate(
            stats.RatioSums(
                n=runs,
                cost=stats.as_decimal(energy),
                units=stats.as_decimal(units),
                cost_sq=stats.as_decimal(r.get("energy_sq")),
                cost_units=stats.as_decimal(r.get("energy_units")),
                units_sq=stats.as_decimal(r.get("units_sq")),
            )
        )
    base = per_unit.get(control.pk) if control else None
    for arm in arms:
        value, fig = per_unit[arm.pk], out[arm.pk]
        if value is None or not base:
            continue
        fig["carbon_deviation"] = value / base - 1.0
        est, ref = estimates[arm.pk], estimates[control.pk]
        if arm.is_control or est is None or ref is None or min(est.n, ref.n) < policy.min_cs_runs:
            continue
        bounds = stats.relative_deviation(est, ref, alpha=policy.alpha, r2=policy.r2)
        if bounds is not None:
            fig["carbon_deviation_low"], fig["carbon_deviation_high"] = bounds.low, bounds.high
    return out


def report_comparison(*, experiment: Experiment, latest: dict) -> Comparison:
    """The report compares at its latest window's table, as the bounds beside it were. Before the
    first window nothing is rolled up to re-price: arms compare as billed (no table). Usage since
    the latest window compares as billed too."""
    snapshot = next(iter(latest.values()), None)
    return Comparison.of(
        table_id=snapshot.pricing_table_id if snapshot else None,
        valid_from=snapshot.pricing_valid_from if snapshot else None,
        cost_model=experiment.cost_model,
    )
