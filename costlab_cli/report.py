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
    "vs control",
    "verdict",
]


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


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
        f"(freeze threshold {report['threshold'] * 100:g}%)"
    )
    return "\n".join(
        [title, line(COLUMNS), line(["-" * w for w in widths]), *(line(r) for r in body)]
    )


def as_markdown(report: dict) -> str:
    title = (
        f"### costlab: experiment {report['experiment_id']} '{report['name']}' "
        f"(freeze threshold {report['threshold'] * 100:g}%)"
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
    )
    return "\n".join([title, "", head, rule, *lines]) + note


def cmd_report(api: Api, args) -> int:
    report = api.get(f"experiments/{args.experiment}/report/")
    if args.format == "json":
        print(json.dumps(report, indent=2))
    elif args.format == "markdown":
        print(as_markdown(report))
    else:
        print(as_table(report))
    return 0
