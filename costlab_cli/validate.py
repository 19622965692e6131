"""`costlab validate`: check a strategy file against the server's schema and the measured devices
of a queue, storing nothing.

Exit 0: valid (warnings do not fail it; each is printed on stderr). 1: the server refused the
strategy (the reason names the key). 2: could not check (unreadable file, API error).
"""

from __future__ import annotations

import sys

from costlab_cli.client import Api, CliError, print_warnings
from costlab_cli.submit import read_strategy

INVALID = 1


def cmd_validate(api: Api, args) -> int:
    text = read_strategy(args.strategy_file, what="STRATEGY_FILE")
    body = {"strategy_yaml": text, "queue": args.queue}
    try:
        answer = api.post("arms/validate/", body, idempotent=True)  # stores nothing: repeatable
    except CliError as exc:
        if exc.status not in (400, 413):  # 413: a body over the size limit is refused too
            raise
        print(f"costlab validate: invalid: {exc.reason}", file=sys.stderr)
        return INVALID
    print(f"valid {answer['strategy_sha256']}")
    print_warnings("validate", answer)
    return 0


def add_parser(sub) -> None:
    v = sub.add_parser(
        "validate",
        help="Check a strategy file (schema, and the dtypes it names on a queue's measured "
        "devices) without storing anything.",
        description="Prints 'valid SHA256' (the hash the server gives the strategy) and each "
        "warning on stderr: a dtype the strategy names (e.g. precision.compute_dtype: bf16) that "
        "is emulated or slower than fp32 on every device the queue has measured. Exit 0 when "
        "valid, warnings or not; 1 when refused (the reason names the key); 2 on an error.",
    )
    v.add_argument("strategy_file", metavar="STRATEGY_FILE", help="Strategy YAML.")
    v.add_argument(
        "--queue",
        choices=["cpu", "gpu"],
        default="cpu",
        help="Whose measured devices to check the strategy's dtypes against (cpu).",
    )
    v.set_defaults(handler=cmd_validate)
