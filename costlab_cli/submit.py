"""`costlab submit` and `costlab status`: which arm a strategy file runs on, the run,
and waiting for it.

How --strategy maps onto an arm (the file's exact bytes are hashed with SHA-256, as the server
does):
  --arm NAME given:  the arm NAME of the experiment. Missing: created with this strategy and
                     weight 0 (it gets runs only when named, so routed submissions keep their
                     split). Present with another strategy: its strategy is replaced (a new
                     revision). The control arm is never changed from here: the baseline changes
                     deliberately, not from a branch.
  no --arm:          the experiment's arm whose strategy has this hash; none is an error naming
                     the hash.
An arm created or updated here prints the server's warnings on stderr (a dtype the strategy names
that is emulated or slower than fp32 on a training queue's measured devices); they never fail it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import uuid
from pathlib import Path

from costlab_cli.client import Api, CliError, print_warnings

TERMINAL = {"succeeded", "failed", "cancelled", "lost"}


def read_strategy(path: str, *, what: str = "--strategy") -> str:
    try:
        return Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise CliError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CliError(f"{what}: {path} is not UTF-8 text") from None


def strategy_normalise(text: str) -> str:
    """LF line endings and one final newline: the server stores and hashes strategy text so (a file
    saved on Windows, or typed into a browser, is the same strategy). Mirrors
    apps.experiments.strategies.strategy_normalise; the CLI imports nothing of the server."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
    return text + "\n" if text else ""


def strategy_digest(text: str) -> str:
    """The SHA-256 the server gives this strategy (apps.experiments.strategies.strategy_sha256)."""
    return hashlib.sha256(strategy_normalise(text).encode("utf-8")).hexdigest()


def arm_for_strategy(
    api: Api, *, experiment: int, text: str, arm_name: str | None, path: str
) -> tuple[dict, str]:
    """The arm to run and what was done to get it: 'matched', 'created' or 'updated'."""
    text = strategy_normalise(text)
    digest = strategy_digest(text)
    if arm_name is None:
        arms = api.get("arms/", experiment=experiment, strategy_sha256=digest)["results"]
        if not arms:
            raise CliError(
                f"no arm of experiment {experiment} has the strategy in {path} "
                f"(sha256 {digest[:12]}); "
                "pass --arm NAME to create or update one"
            )
        active = [a for a in arms if a["state"] == "active"]
        return (active or arms)[0], "matched"
    found = api.get("arms/", experiment=experiment, name=arm_name)["results"]
    if not found:
        arm = api.post(
            "arms/",
            {"experiment": experiment, "name": arm_name, "strategy_yaml": text, "weight": "0"},
        )
        print_warnings("submit", arm)
        return arm, "created"
    arm = found[0]
    if arm["strategy_sha256"] == digest:
        return arm, "matched"
    if arm["is_control"]:
        raise CliError(
            f"--arm: '{arm_name}' is the control arm and its strategy differs from {path}; "
            f"change the baseline deliberately (PATCH /api/v1/arms/{arm['id']}/), not from a CI run"
        )
    arm = api.patch(f"arms/{arm['id']}/", {"strategy_yaml": text})
    print_warnings("submit", arm)
    return arm, "updated"


EXTERNAL_ONLY = ("gpu_sku", "gpu_count", "vcpus", "memory_gb", "resource_id")


def cmd_submit(api: Api, args) -> int:
    external = getattr(args, "external", False)
    if not external:
        given = [
            f"--{k.replace('_', '-')}" for k in EXTERNAL_ONLY if getattr(args, k, None) is not None
        ]
        if given:
            raise CliError(
                f"{given[0]}: only for --external runs (a worker measures what it holds)"
            )
    elif args.wait:
        raise CliError(
            "--wait: an external run ends when its trainer POSTs /finish/; "
            "it cannot be waited on here"
        )
    text = read_strategy(args.strategy)
    arm, how = arm_for_strategy(
        api, experiment=args.experiment, text=text, arm_name=args.arm, path=args.strategy
    )
    body = {
        "experiment": args.experiment,
        "arm": arm["id"],
        "run_key": args.run_key or os.environ.get("COSTLAB_RUN_KEY") or f"cli-{uuid.uuid4().hex}",
        "git_sha": args.git_sha if args.git_sha is not None else os.environ.get("GITHUB_SHA", ""),
    }
    if getattr(args, "tag", None):
        body["tags"] = args.tag
    if getattr(args, "note", None):
        body["note"] = args.note
    priority = getattr(args, "priority", None) or ("ci" if os.environ.get("CI") else None)
    if priority and not external:
        body["priority"] = priority
    if external:
        body["kind"] = "external"
        body.update(
            {k: getattr(args, k) for k in EXTERNAL_ONLY if getattr(args, k, None) is not None}
        )
    run = api.post(
        "runs/", body, idempotent=True
    )  # the run key makes a retried POST return the same run
    print_warnings("submit", run)
    revision = f" revision {arm.get('revision', 1)}" if how == "updated" else ""
    print(
        f"run {run['id']} {run['status']} on arm '{run['arm']['name']}' ({how}{revision}) "
        f"of experiment {args.experiment}"
        + (" (external: send telemetry, then finish)" if external else "")
    )
    if not args.wait:
        return 0
    return wait_for(api, run["id"], poll_s=args.poll, timeout_s=args.timeout)


def wait_for(api: Api, run_id: int, *, poll_s: float, timeout_s: float) -> int:
    """0 when the run succeeded, 1 when it ended otherwise;
    CliError (2) when it outlives the timeout."""
    deadline = time.monotonic() + timeout_s
    said = None
    wait_s = min(poll_s, 0.5)  # a short run answers in seconds: the checks slow down to poll_s
    while True:
        run = api.get(f"runs/{run_id}/")
        if run["status"] in TERMINAL:
            print(describe(run))
            return 0 if run["status"] == "succeeded" else 1
        if time.monotonic() >= deadline:
            raise CliError(
                f"run {run_id} is still {run['status']} after {timeout_s:g} s (--timeout)"
            )
        line = progress(run)
        if line != said:  # a line only when something changed
            print(line, file=sys.stderr, flush=True)
            said = line
        time.sleep(max(0.0, min(wait_s, deadline - time.monotonic())))
        wait_s = min(poll_s, wait_s * 2)


def progress(run: dict) -> str:
    """'run 17: queued, position 3 (ci), starts in about 2 min (estimate)' or
    'run 17: running, 40 steps'."""
    place = run.get("queue_position")
    if run["status"] == "queued" and place:
        eta = place.get("eta_s")
        when = (
            "no recent run to estimate a start from"
            if eta is None
            else (f"starts in about {_about(eta)} (estimate)")
        )
        return (
            f"run {run['id']}: queued, position {place['position']} "
            f"({run.get('priority', 'normal')}), {when}"
        )
    return f"run {run['id']}: {run['status']}, {run['steps']} steps"


def _about(seconds: float) -> str:
    if seconds < 90:
        return f"{max(round(seconds / 10) * 10, 10):.0f} s"
    return f"{round(seconds / 60):.0f} min"


def describe(run: dict) -> str:
    estimated = " (energy estimated)" if run.get("energy_estimated") else ""
    line = (
        f"run {run['id']}: {run['status']} · arm '{run['arm']['name']}' · {run['steps']} steps · "
        f"{run['tokens']:,} tokens · {float(run['cost_usd']):.6f} USD{estimated}"
    )
    if run["status"] in ("failed", "lost") and run.get("error"):
        line += f" · {run['error'].strip().splitlines()[-1][:160]}"
    return line


def cmd_status(api: Api, args) -> int:
    run = api.get(f"runs/{args.run}/")
    if args.json:
        import json

        print(json.dumps(run, indent=2))
    else:
        print(describe(run))
    return 0
