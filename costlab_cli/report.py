"""`costlab report`: the experiment's per-arm comparison as a table, JSON or Markdown."""

from __future__ import annotations

import json

from costlab_cli.client import Api

COLUMNS = [
    "arm",
    "state",
    "runs",
    "GPU h",
    "energy kWh",
    "total USD",
    "USD/1M tok",
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
                _carbon(arm.get("carbon") or {}),
                _num(arm.get("gco2e_per_mtok"), 2),
                _pct(arm["deviation"]),
                arm["verdict"],
            ]
        )
    return out


def as_table(report: dict) -> str:
    body = rows(report)
    widths = [
        max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in enumerate(COLUMNS)
    ]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    title = (
        f"experiment {report['experiment_id']} '{report['name']}' "
        f"(freeze threshold {report['threshold'] * 100:g}%{_compared_on(report)})"
    )
    return "\n".join(
        [title, line(COLUMNS), line(["-" * w for w in widths]), *(line(r) for r in body)]
    )


def as_markdown(report: dict) -> str:
    title = (
        f"### costlab: experiment {report['experiment_id']} '{report['name']}' "
        f"(freeze threshold {report['threshold'] * 100:g}%{_compared_on(report)})"
    )
    head = "| " + " | ".join(COLUMNS) + " |"
    rule = (
        "|"
        + "|".join("---" if i < 2 or i == len(COLUMNS) - 1 else "---:" for i in range(len(COLUMNS)))
        + "|"
    )
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows(report)]
    note = (
        "\n\n_est._: energy modelled, not measured."
        if any(a["energy_estimated"] for a in report["arms"])
        else ""
    ) + "\n\ngCO2e as billed, ± its measurement band (NVML 5 %, RAPL 10 %, modelled 50 %)."
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
