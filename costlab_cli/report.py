"""`costlab report`: the experiment's per-arm comparison as a table, JSON or Markdown.

Beside USD per 1M tokens, each arm's quality against the control (costlab_cli.quality's words)
and its estimated USD to reach the control's quality ('≈', 'not reached'); JSON is the API's
report as it came.
"""

from __future__ import annotations

import json

from costlab_cli.client import Api
from costlab_cli.quality import metric_label, percent, usd_to_target_words, verdict_words

QUALITY_VALUE = "quality value"  # the header is the report's metric: 'held-out loss', 'accuracy'
COLUMNS = [
    "arm",
    "state",
    "runs",
    "GPU h",
    "energy kWh",
    "total USD",
    "USD/1M tok",
    "≈USD to target",
    QUALITY_VALUE,
    "quality",
    "gCO2e",
    "gCO2e/1M tok",
    "vs control",
    "verdict",
]


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _carbon(carbon: dict) -> str:
    """gCO2e as billed with its band: '1,234.5 ±5%'; 'unpriced' where no version had an
    intensity."""
    if carbon.get("unpriced") and carbon.get("g_co2e") is None:
        return "unpriced"
    if carbon.get("g_co2e") is None:
        return "-"
    return f"{carbon['g_co2e']:,.1f} ±{carbon['band'] * 100:g}%"


def columns(report: dict) -> list[str]:
    label = metric_label(report.get("quality_metric"))
    return [label if c == QUALITY_VALUE else c for c in COLUMNS]


def _quality_cells(report: dict, arm: dict) -> list[str]:
    """≈USD to target, the arm's mean final value of the quality metric, its verdict in words."""
    q = arm.get("quality")
    verdict = verdict_words(q)
    if arm["is_control"] and verdict != "not measured":
        verdict = "-"  # the control is what the others are compared with
    return [
        usd_to_target_words(arm, target=report.get("quality_target")),
        _num((q or {}).get("value"), 4),
        verdict,
    ]


def rows(report: dict) -> list[list[str]]:
    out = []
    for arm in report["arms"]:
        name = arm["name"] + (" (control)" if arm["is_control"] else "")
        energy = _num(arm["energy_kwh"], 3) + (" est." if arm["energy_estimated"] else "")
        out.append(
            [
                name,
                arm["state"],
                str(arm["runs"]),
                _num(arm["gpu_hours"], 3),
                energy,
                _num(arm["total_usd"], 4),
                _num(arm["usd_per_mtok"], 4),
                *_quality_cells(report, arm),
                _carbon(arm.get("carbon") or {}),
                _num(arm.get("gco2e_per_mtok"), 2),
                _pct(arm["deviation"]),
                arm["verdict"],
            ]
        )
    return out


def quality_note(report: dict) -> str:
    """What the quality columns mean, with the experiment's rule and target."""
    label = metric_label(report.get("quality_metric"))
    better = "higher" if report.get("quality_direction") == "higher" else "lower"
    target = report.get("quality_target")
    reach = (
        f"≈: estimated USD a run took to reach the control's mean {label} {target:.4f} (its bill "
        "pro rata of its wall time at its evaluations), the mean over the runs that reached it"
        if target is not None
        else "≈USD to target: none yet (the control has no evaluated finished run)"
    )
    return (
        f"quality: {label} ({better} is better) against the control, margin "
        f"{percent(report.get('quality_margin', 0.01))}; {reach}."
    )


def unpriced_note(report: dict) -> str:
    """The arms with usage billed with no price: never compared (their verdict is unpriced)."""
    said = []
    for arm in report["arms"]:
        if arm.get("unpriced"):
            parts = ", ".join(f"{c} {v:g} s" for c, v in sorted(arm["unpriced"].items()))
            skus = arm.get("unpriced_skus") or []
            said.append(
                f"unpriced: arm '{arm['name']}' {parts}"
                + (f" (no price for {', '.join(skus)})" if skus else "")
                + "; not compared until priced."
            )
    return "\n".join(said)


def as_table(report: dict) -> str:
    body = rows(report)
    head = columns(report)
    widths = [
        max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in enumerate(head)
    ]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    title = (
        f"experiment {report['experiment_id']} '{report['name']}' "
        f"(freeze threshold {report['threshold'] * 100:g}%{_compared_on(report)})"
    )
    return "\n".join(
        [
            title,
            line(head),
            line(["-" * w for w in widths]),
            *(line(r) for r in body),
            "",
            quality_note(report),
            *([unpriced_note(report)] if unpriced_note(report) else []),
        ]
    )


def as_markdown(report: dict) -> str:
    title = (
        f"### costlab: experiment {report['experiment_id']} '{report['name']}' "
        f"(freeze threshold {report['threshold'] * 100:g}%{_compared_on(report)})"
    )
    left = {"arm", "state", "quality", "verdict"}
    head = "| " + " | ".join(columns(report)) + " |"
    rule = "|" + "|".join("---" if c in left else "---:" for c in COLUMNS) + "|"
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows(report)]
    note = (
        (
            "\n\n_est._: energy modelled, not measured."
            if any(a["energy_estimated"] for a in report["arms"])
            else ""
        )
        + (
            "\n\ngCO2e as billed, ± its measurement band (NVML 5 %, RAPL 10 %, modelled 50 %)."
            f"\n\n{quality_note(report)}"
        )
        + (f"\n\n{unpriced_note(report)}" if unpriced_note(report) else "")
    )
    return "\n".join([title, "", head, rule, *lines]) + note


def _compared_on(report: dict) -> str:
    return "; vs control on gCO2e" if report.get("compared_on") == "gco2e" else ""


def cmd_report(api: Api, args) -> int:
    report = api.get(
        f"experiments/{args.experiment}/report/", metric=getattr(args, "metric", "usd")
    )
    if args.format == "json":
        print(json.dumps(report, indent=2))
    elif args.format == "markdown":
        print(as_markdown(report))
    else:
        print(as_table(report))
    return 0
