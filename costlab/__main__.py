"""``python -m costlab resend DIR``: deliver a spool a tracked run left behind, and end the run.

Exit status: 0 when the spool is done with and removed: delivered (the run ended as the process
that left it ended), or the run had already ended elsewhere, so the server takes none of its
samples (they are dropped, and the line says how many). 2 when it failed (the site unreachable, a
refusal, no spool there): the spool is kept for another try."""

from __future__ import annotations

import argparse
import sys

from costlab.resend import resend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m costlab")
    commands = parser.add_subparsers(dest="command", required=True)
    send = commands.add_parser("resend", help="deliver a left spool and end its run")
    send.add_argument("spool_dir")
    send.add_argument("--retry-for", type=float, default=300.0, help="seconds of outage to ride")
    args = parser.parse_args(argv)
    try:
        done = resend(args.spool_dir, retry_for_s=args.retry_for)
    except Exception as exc:  # one line, not a traceback: the spool stays for another try
        print(f"costlab resend: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    who = "the run" if done["run_id"] is None else f"run {done['run_id']}"
    line = f"{who}: {done['sent']} samples sent, {done['refused']} refused"
    if done["dropped"]:
        line += f", {done['dropped']} dropped: the run had already ended ({done['status']})"
    elif done["status"]:
        line += f"; now {done['status']}"
    print(line + f"; {args.spool_dir} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
