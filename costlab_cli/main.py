"""costlab CLI: validate strategies, submit runs, upload runs trained elsewhere, read their status
and the experiment report, and gate a CI build on cost and quality.

Reads COSTLAB_URL (the site, e.g. https://costlab.example.com) and COSTLAB_TOKEN
(a tenant's API token).
Exit status: 0 success / pass, 1 cost regression (gate), a run that did not succeed (submit --wait)
or a strategy refused (validate), 2 error, 3 quality regression (gate --max-quality-loss), 4
quality not measured (gate --max-quality-loss). Every outcome prints one line that says why.
Warnings (e.g. a dtype emulated or slower than fp32 on every device a queue has measured) go to
stderr as "costlab COMMAND: warning: ..." and never change the exit status.
"""

from __future__ import annotations

import argparse
import sys

from costlab_cli import __version__
from costlab_cli.client import Api, CliError
from costlab_cli.gate import cmd_gate
from costlab_cli.report import cmd_report
from costlab_cli.submit import cmd_status, cmd_submit
from costlab_cli.sweep import add_parser as add_sweep_parser
from costlab_cli.upload import add_parser as add_upload_parser
from costlab_cli.validate import add_parser as add_validate_parser

EXIT_ERROR = 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="costlab",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"costlab {__version__}")
    p.add_argument("--url", help="Overrides COSTLAB_URL.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_validate_parser(sub)

    s = sub.add_parser(
        "submit", help="Submit a run of a strategy file (see --arm for how it maps onto an arm)."
    )
    s.add_argument("--experiment", type=int, required=True, metavar="ID")
    s.add_argument("--strategy", required=True, metavar="FILE", help="Strategy YAML.")
    s.add_argument(
        "--arm",
        metavar="NAME",
        help="Run on this arm: created if missing (weight 0), its strategy replaced if it differs "
        "(never the control's); the server's warnings on that strategy go to stderr. "
        "Without it: the arm whose strategy has the file's SHA-256.",
    )
    s.add_argument("--git-sha", metavar="SHA", help="Commit trained (default $GITHUB_SHA).")
    s.add_argument(
        "--run-key",
        metavar="KEY",
        help="Idempotency key: the same key returns the same run "
        "(default $COSTLAB_RUN_KEY, else random).",
    )
    s.add_argument(
        "--wait", action="store_true", help="Wait until the run ends; exit 1 unless it succeeded."
    )
    s.add_argument(
        "--tag",
        action="append",
        metavar="TAG",
        help="A label for the run (repeatable): found again with the runs page's search or "
        "GET /api/v1/runs/?q=TAG.",
    )
    s.add_argument("--note", metavar="TEXT", help="A note on the run (why it was submitted).")
    s.add_argument(
        "--priority",
        choices=["ci", "normal", "batch"],
        default=None,
        help="ci: taken before every normal and batch run queued (default ci when $CI is set, "
        "as pipelines set it; else normal).",
    )
    s.add_argument(
        "--external",
        action="store_true",
        help="Create an external run: trained elsewhere, "
        "telemetry POSTed to /api/v1/runs/ID/telemetry/, "
        "ended with POST /api/v1/runs/ID/finish/. Prints the run id.",
    )
    s.add_argument(
        "--gpu-sku", metavar="NAME", help="External runs: the GPU model held (priced per GPU-hour)."
    )
    s.add_argument(
        "--gpu-count",
        type=int,
        metavar="N",
        help="External runs: GPUs held (default 1 with --gpu-sku).",
    )
    s.add_argument(
        "--vcpus", type=int, metavar="N", help="External runs: vCPUs held (priced per vCPU-hour)."
    )
    s.add_argument(
        "--memory-gb",
        type=float,
        metavar="GB",
        help="External runs: host memory held (priced per GB-hour).",
    )
    s.add_argument(
        "--resource-id",
        metavar="ID",
        help="External runs: the cloud resource it trains on, as the invoice's FOCUS ResourceId "
        "names it (billing's reconciliation matches it).",
    )
    s.add_argument(
        "--poll",
        type=float,
        default=5.0,
        metavar="S",
        help="Seconds between status checks, at most (5; the first after 0.5 s, doubling).",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=6 * 3600,
        metavar="S",
        help="Give up waiting after S seconds.",
    )
    s.add_argument(
        "--retry-for",
        type=float,
        default=120.0,
        metavar="S",
        help="Ride out an outage of the site (unreachable, 502/503/504, 429) for up to S seconds, "
        "with backoff, saying so on stderr (120). The run key makes a repeated submit safe.",
    )
    s.set_defaults(handler=cmd_submit)

    add_upload_parser(sub)

    st = sub.add_parser("status", help="One line on a run: status, arm, steps, tokens, cost.")
    st.add_argument("run", type=int, metavar="RUN")
    st.add_argument("--json", action="store_true", help="The whole run as JSON.")
    st.set_defaults(handler=cmd_status)

    r = sub.add_parser("report", help="Per-arm comparison of an experiment.")
    r.add_argument("experiment", type=int, metavar="EXP")
    r.add_argument("--format", choices=["table", "json", "markdown"], default="table")
    r.add_argument(
        "--metric",
        choices=["usd", "gco2e"],
        default="usd",
        help="What 'vs control' and the verdict compare: USD (default) or gCO2e per unit of work.",
    )
    r.set_defaults(handler=cmd_report)

    g = sub.add_parser(
        "gate",
        help="Exit 1 when a candidate costs more than the control by more than allowed; with "
        "--max-quality-loss, 3 when its model is worse by more than allowed, 4 when its quality "
        "is not measured.",
    )
    g.add_argument("experiment", type=int, metavar="EXP")
    g.add_argument(
        "--max-regression", required=True, metavar="PCT", help="e.g. 5%% (or the fraction 0.05)."
    )
    who = g.add_mutually_exclusive_group()
    who.add_argument(
        "--arm",
        action="append",
        metavar="NAME",
        help="Candidate arm(s) to judge (repeatable); "
        "default every non-control arm with priced runs.",
    )
    who.add_argument(
        "--run", type=int, metavar="RUN", help="Judge this succeeded run against the control arm."
    )
    g.add_argument(
        "--max-quality-loss",
        metavar="PCT",
        help="Also fail (exit 3) when the arm's held-out quality (the experiment's quality "
        "metric) is worse than the control's by more than PCT, e.g. 1%%, and (exit 4) when it is "
        "not measured. Without it, quality is printed but never changes the exit status.",
    )
    g.add_argument(
        "--evidence",
        action="store_true",
        help="Fail only when the freeze rule's always-valid lower bound clears the limit "
        "(default: the point estimate, the cautious choice); quality likewise, on its bound.",
    )
    g.add_argument(
        "--metric",
        choices=["usd", "gco2e"],
        default="usd",
        help="Gate on USD (default) or on gCO2e per unit of work.",
    )
    g.set_defaults(handler=cmd_gate)
    add_sweep_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        api = Api(url=args.url, retry_for_s=getattr(args, "retry_for", 0.0) or 0.0)
        try:
            return args.handler(api, args)
        finally:
            api.close()
    except CliError as exc:
        print(f"costlab {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"costlab {args.command}: interrupted", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
