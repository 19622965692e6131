"""A run page's training metrics (one small chart per metric, downsampled in SQL) and its
hyperparameters table (flattened dotted keys, or only the keys that differ from another run)."""

from __future__ import annotations

import json
from typing import Any

from apps.experiments.models import Run
from apps.experiments.params import params_diff, params_flat
from apps.telemetry.metrics import run_metric_series, run_metric_summary

CHARTED = 8  # metrics charted; the rest are named under the charts
POINTS = 400  # per chart (a 390-px screen shows fewer)
# Charted first where present: what a training's health is read from.
FIRST = ("loss", "train_loss", "eval_loss", "learning_rate", "grad_norm")
LONG_TABLE = 20  # rows past which the table opens folded
VALUE_CHARS = 300  # a longer value is cut on the page (the API answers it whole)


def training_metrics(*, run: Run) -> dict:
    """The metric names (the FIRST ones first, then by name), the series of the first CHARTED,
    and the names left uncharted. One query without metrics, three at most with."""
    summary = run_metric_summary(run_id=run.pk)
    order = {name: i for i, name in enumerate(FIRST)}
    names = sorted(summary, key=lambda n: (order.get(n, len(order)), n))
    charted = names[:CHARTED]
    series = run_metric_series(run_id=run.pk, names=charted, points=POINTS, spans=summary)
    return {
        "names": charted,
        "uncharted": names[CHARTED:],
        "summary": summary,
        "series": {name: s.as_json() for name, s in series.items()},
    }


def _shown(value: Any) -> str:
    """A parameter as the page shows it: a string as it is, anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def hyperparameters(*, run: Run, against: Run | None = None) -> dict:
    """The run's reported params flattened ({key, value} rows, sorted); with `against`, only the
    keys that differ ({key, this, other, only}) and how many keys agree."""
    flat = params_flat(run.params)
    rows = [{"key": key, "value": _shown(value)} for key, value in flat.items()]
    out: dict = {"rows": rows, "long": len(rows) > LONG_TABLE, "against": against}
    if against is not None:
        diff = params_diff(flat, params_flat(against.params))
        out["diff"] = [
            {
                "key": d["key"],
                "this": "" if d.get("only") == "other" else _shown(d["this"]),
                "other": "" if d.get("only") == "this" else _shown(d["other"]),
                "only": d.get("only", ""),
            }
            for d in diff
        ]
        out["same"] = len(set(flat) - {d["key"] for d in diff})
    return out
