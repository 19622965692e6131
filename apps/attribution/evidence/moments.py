"""The rollup's sums for the tick: an arm's observations summed per window or epoch, and the
run-level moments the freeze rule's variance needs (each run's cumulative compared cost, tokens
and steps), re-priced at the comparison's table where an epoch holds usage recorded under another.
Set-based SQL over the (arm, window) index; Postgres sums exactly, SQLite's floats are rounded to
the snapshot columns' scales, so a recompute reproduces a tick."""

from __future__ import annotations

from dataclasses import replace
from decimal import ROUND_HALF_EVEN, Decimal, localcontext

from django.db import connection
from django.db.models import Count, DecimalField, ExpressionWrapper, F, Q, Sum
from django.db.models.functions import Cast

from apps.attribution.decide.decisions import ArmSums, RunMoments
from apps.attribution.decide.stats import as_decimal
from apps.attribution.evidence.comparison import Comparison, PriceDelta
from apps.attribution.models import AttributionWindow, RunCursor, RunWindow
from apps.core.db import cte_fenced, is_postgres
from apps.experiments.models import Arm, Run
from apps.pricing.prices import FREE
from apps.pricing.selectors import table_prices


def _exact(digits: int, places: int) -> DecimalField:
    return DecimalField(max_digits=digits, decimal_places=places)


def _sums_annotations() -> dict:
    """ArmSums' fields as aggregates, named a_<field>
    (a bare name would shadow the column it sums)."""
    return {
        f"a_{k}": v
        for k, v in {
            "observations": Count("pk"),
            "runs": Count("pk", filter=Q(first_seen=True)),
            "samples": Sum("samples"),
            "cost": Sum("cost_usd"),
            "tokens": Sum("tokens"),
            "steps": Sum("steps"),
            "gpu_seconds": Sum("gpu_seconds"),
            "wall_s": Sum("wall_s"),
            "energy_j": Sum("energy_j"),
            "estimated": Count("pk", filter=Q(energy_estimated=True)),
            "cost_sq": Sum(
                ExpressionWrapper(F("cost_usd") * F("cost_usd"), output_field=_exact(48, 12))
            ),
            "cost_tokens": Sum(
                ExpressionWrapper(F("cost_usd") * F("tokens"), output_field=_exact(48, 6))
            ),
            "tokens_sq": Sum(
                ExpressionWrapper(
                    Cast("tokens", _exact(40, 0)) * F("tokens"), output_field=_exact(48, 0)
                )
            ),
            "cost_steps": Sum(
                ExpressionWrapper(F("cost_usd") * F("steps"), output_field=_exact(48, 6))
            ),
            "steps_sq": Sum(
                ExpressionWrapper(
                    Cast("steps", _exact(40, 0)) * F("steps"), output_field=_exact(48, 0)
                )
            ),
        }.items()
    }


def _arm_sums(row: dict) -> ArmSums:
    return ArmSums.from_row({k[2:]: v for k, v in row.items() if k.startswith("a_")})


def window_sums(*, window_ids: list[int]) -> dict[int, ArmSums]:
    """Per arm: the counted observations of these windows, summed in the database."""
    rows = (
        RunWindow.objects.filter(window_id__in=window_ids, omitted=False)
        .values("arm_id")
        .annotate(**_sums_annotations())
        .order_by("arm_id")
    )
    return {row["arm_id"]: _arm_sums(row) for row in rows}


def observations_sums(
    *, experiment_id: int, after_number: dict[int, int], upto_number: int
) -> dict[int, ArmSums]:
    """Per arm: every counted observation in windows after_number[arm] < number <= upto_number
    (a recompute)."""
    rows = (
        RunWindow.objects.filter(
            window__experiment_id=experiment_id, window__number__lte=upto_number, omitted=False
        )
        .values("arm_id", "window__number")
        .annotate(**_sums_annotations())
        .order_by("arm_id", "window__number")
    )
    out: dict[int, ArmSums] = {}
    for row in rows:
        if row["window__number"] > after_number.get(row["arm_id"], 0):
            out[row["arm_id"]] = out.get(row["arm_id"], ArmSums()) + _arm_sums(row)
    return out


def run_moments(
    *,
    epochs: dict[int, int],
    upto_number: dict[int, int],
    comparisons: dict[int, Comparison] | None = None,
    repriced: set[int] | None = None,
    exclude_runs: set[int] | None = None,
    from_cursors: bool = False,
) -> dict[int, RunMoments]:
    """Per arm: its runs' cumulative compared cost, tokens and steps in windows epochs[arm] < number
    <= upto_number[arm], reduced to the run-level moments the freeze rule's variance needs.

    A run's compared cost is its billed cost where every second of its experiment's runs was
    billed at the comparison's table; for the arms in `repriced` (apps.attribution.selectors.
    experiments_priced_from_usage: another version could have billed some of it) it is the
    usage its windows rolled up priced at comparisons[arm]'s table, never the bill plus a delta
    (a window's bill can span several versions). Summed in the database, one query per kind.
    Windows of an experiment are created in number order, so their ids grow with their numbers:
    the epoch becomes an id range, read from the (arm, window) index.

    `from_cursors` (the tick, once `cursors_advance` has run; upto_number is then each arm's newest
    window): on Postgres, the arms priced as billed read their runs' epoch sums from the cursors,
    one row a run, however many windows the epoch holds.
    """
    if not epochs:
        return {}
    comparisons = comparisons or {}
    moved = {
        a
        for a in (repriced or ())
        if a in epochs and a in comparisons and comparisons[a].needs_usage_pricing
    }
    plain = {a: e for a, e in epochs.items() if a not in moved}
    if from_cursors and is_postgres():
        out = _moments_from_cursors(epochs=plain, exclude=exclude_runs)
    else:
        out = _moments(
            epochs=plain, upto_number=upto_number, comparisons=comparisons, exclude=exclude_runs
        )
    if moved:
        out.update(
            _moments(
                epochs={a: epochs[a] for a in moved},
                upto_number=upto_number,
                comparisons=comparisons,
                units=unit_prices({a: comparisons[a] for a in moved}, skus=arm_skus(arm_ids=moved)),
                exclude=exclude_runs,
            )
        )
    return out


def arm_skus(*, arm_ids) -> dict[int, set[int | None]]:
    """Per arm, the GPU SKUs its runs used (None: a CPU run). One query."""
    out: dict[int, set[int | None]] = {a: set() for a in arm_ids}
    for arm_id, sku in (
        Run.objects.filter(arm_id__in=list(arm_ids)).values_list("arm_id", "gpu_sku_id").distinct()
    ):
        out[arm_id].add(sku)
    return out


def unit_prices(
    comparisons: dict[int, Comparison], *, skus: dict[int, set[int | None]]
) -> dict[tuple[int, int | None], PriceDelta]:
    """Per (key, SKU): the USD of one unit of each rolled-up resource at the key's comparison
    table (a SKU the table does not price: its GPU time at 0, as the bill marks it unpriced)."""
    prices = table_prices(table_ids={c.table_id for c in comparisons.values()})
    out = {}
    for key, c in comparisons.items():
        cpu = prices[(c.table_id, None)]
        for sku in skus.get(key, ()) or {None}:
            at = prices.get((c.table_id, sku)) or replace(
                cpu, gpu_hour_usd=0.0, unpriced=cpu.unpriced | {"gpu"}
            )
            out[(key, sku)] = PriceDelta.between(target=at, billed=FREE, weights=c.weights)
    return out


def _moments(
    *,
    epochs: dict,
    upto_number: dict,
    comparisons: dict,
    units: dict | None = None,
    exclude: set[int] | None = None,
) -> dict:
    """run_moments' sums in one query; with units ((arm, SKU) -> PriceDelta of one unit at the
    arm's comparison table), each run's cost is its rolled-up usage priced there; the runs in
    `exclude` left out."""
    if not epochs:
        return {}
    exact, rw, run = "NUMERIC(40, 0)", _RW, Run._meta.db_table
    cost, joins, k_params = "SUM(rw.cost_usd)", "", []
    if units:
        k = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(units))
        k_params = [
            v
            for (arm_id, sku), d in units.items()
            for v in (arm_id, sku or 0, d.gpu_second, d.joule, d.vcpu_second, d.gb_second)
        ]
        # The usage times the unit prices (PriceDelta.times), rounded per run as a bill is.
        cost = (
            "ROUND(COALESCE(SUM("
            "rw.gpu_seconds * k.dg + rw.energy_j * k.de + rw.wall_s * "
            "(x.vcpus * k.dv + CAST(x.memory_gb AS NUMERIC) * k.dm)), 0), 6)"
        )
        joins = (
            f"JOIN {run} x ON x.id = rw.run_id "
            "LEFT JOIN k ON k.arm_id = rw.arm_id AND k.sku = COALESCE(x.gpu_sku_id, 0)"
        )
        k = f", k(arm_id, sku, dg, de, dv, dm) AS (VALUES {k})"
    else:
        k = ""
    excluded = f" AND rw.run_id NOT IN ({', '.join(['%s'] * len(exclude))})" if exclude else ""
    sql = f"""
        {epoch_ranges(len(epochs))}{k},
        r AS (
            SELECT rw.arm_id, {cost} AS c, CAST(SUM(rw.tokens) AS {exact}) AS t,
                   CAST(SUM(rw.steps) AS {exact}) AS s
            FROM {cte_fenced("b") if units else "b"}
            JOIN {rw} rw ON rw.arm_id = b.arm_id AND rw.window_id > b.lo AND rw.window_id <= b.hi
            {joins}
            WHERE rw.omitted = %s{excluded}
            GROUP BY rw.arm_id, rw.run_id
        ){_moments_of_runs()}
    """
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            epoch_params(epochs, upto_number, comparisons)
            + k_params
            + [False]
            + sorted(exclude or ()),
        )
        return _as_moments(cursor.fetchall())


def _moments_of_runs(by: str = "arm_id", runs: str = "COUNT(*)") -> str:
    """An arm's moments from its runs' sums r(arm_id, c, t, s), grouped by `by`: what the freeze
    rule's variance needs. `runs`: how the runs that count are counted."""
    return f"""
        SELECT {by}, {runs}, SUM(c), SUM(c * c), SUM(c * t), SUM(t * t), SUM(c * s), SUM(s * s),
               SUM(t), SUM(s)
        FROM r GROUP BY {by}"""


def _moments_from_cursors(*, epochs: dict, exclude: set[int] | None = None) -> dict:
    """run_moments from the cursors' epoch sums (Postgres; see RunCursor.epoch_after): a run counts
    when its cursor sums its arm's epoch and holds a counted observation, as in `_moments`.
    A run with nothing counted adds zeros to every sum and is not counted. Grouped by arm and
    epoch, the arm's own picked here: with the epoch or the count as a condition on the cursors,
    Postgres estimated one row from their statistics (all zeros just after the columns were added)
    and looped over every cursor for every arm, 15 s a tick at 1,000 experiments."""
    if not epochs:
        return {}
    exact, cur, run = "NUMERIC(40, 0)", RunCursor._meta.db_table, Run._meta.db_table
    sql = f"""
        WITH r AS (
            SELECT x.arm_id, c.epoch_after, c.epoch_cost_usd AS c,
                   CAST(c.epoch_tokens AS {exact}) AS t, CAST(c.epoch_steps AS {exact}) AS s,
                   CASE WHEN c.epoch_observations > 0 THEN 1 END AS counted
            FROM unnest(%s::bigint[]) AS a(id) JOIN {run} x ON x.arm_id = a.id
            JOIN {cur} c ON c.run_id = x.id
            WHERE NOT x.id = ANY(%s)
        ){_moments_of_runs("arm_id, epoch_after", runs="COUNT(counted)")}
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [sorted(epochs), sorted(exclude or ())])
        rows = [
            row[:1] + row[2:] for row in cursor.fetchall() if epochs[row[0]] == row[1] and row[2]
        ]
    return _as_moments(rows)


def _as_moments(rows: list[tuple]) -> dict[int, RunMoments]:
    # Postgres sums exactly at these scales (cost has 6 places); SQLite answers floats: rounded to
    # the same scales, as the snapshot columns store them, so a recompute reproduces a tick.
    with localcontext() as ctx:
        ctx.prec = 80
        return {
            arm_id: RunMoments(
                runs=int(n),
                cost=_at(c, 6),
                cost_sq=_at(cc, 12),
                cost_tokens=_at(ct, 6),
                tokens_sq=_at(tt, 0),
                cost_steps=_at(cs, 6),
                steps_sq=_at(ss, 0),
                tokens=int(t or 0),
                steps=int(st or 0),
            )
            for arm_id, n, c, cc, ct, tt, cs, ss, t, st in rows
        }


_WIN, _RW, _ARM = AttributionWindow._meta.db_table, RunWindow._meta.db_table, Arm._meta.db_table


def epoch_ranges(n: int) -> str:
    """CTEs e and b: per arm, the window-id range (lo, hi] of its epoch (after window number
    after_n), and its comparison table (0: none to re-price at). Parameters: `epoch_params`."""
    values = ", ".join(["(%s, %s, %s, %s)"] * n)
    return f"""
        WITH e(arm_id, after_n, upto_n, cmp) AS (VALUES {values}),
        b AS (
            SELECT e.arm_id, a.experiment_id, e.cmp, e.after_n,
                   COALESCE((SELECT w.id FROM {_WIN} w WHERE w.experiment_id = a.experiment_id
                             AND w.number = e.after_n), 0) AS lo,
                   (SELECT w.id FROM {_WIN} w WHERE w.experiment_id = a.experiment_id
                    AND w.number = e.upto_n) AS hi
            FROM e JOIN {_ARM} a ON a.id = e.arm_id
        )"""


def epoch_params(epochs: dict, upto_number: dict, comparisons: dict) -> list:
    def cmp(arm_id: int) -> int:
        c = comparisons.get(arm_id)
        return c.table_id if c is not None and not c.tiered and c.table_id else 0

    return [
        v
        for arm_id, after in epochs.items()
        for v in (arm_id, after, upto_number[arm_id], cmp(arm_id))
    ]


def _at(value, places: int) -> Decimal:
    return as_decimal(value).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)


def exact_at(value, places: int) -> Decimal:
    """A database sum as an exact Decimal at its column's scale (see run_moments)."""
    return value if isinstance(value, Decimal) else _at(value, places)
