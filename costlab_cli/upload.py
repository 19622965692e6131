"""`costlab upload FILE.jsonl`: a finished run trained elsewhere, posted from its samples.

One sample per line, with the fields POST /api/v1/runs/{id}/telemetry/ takes (`ts` required;
`seq` on every line, or on none and then given by line order). Every line is checked before
anything is sent, and a bad one is refused naming the file, the line and the field. The run is
an external run whose run key defaults to the file's SHA-256, so uploading the same file again
is the same run: an interrupted upload re-run asks the run's `last_seq` and sends only the
samples after it (batches are idempotent by seq), then finishes the run. Its `started_at` and
`ended_at` default to the first and last sample's `ts`, so the run is priced at the price
versions in force when it trained.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path

from costlab_cli.client import Api, CliError

BATCH_MAX = 10_000  # the server's samples per batch
COUNTERS = ("tokens", "step", "energy_j")  # cumulative: never lower than the sample before

# The sample fields the server takes, with what a value must be (the server checks the bounds
# again; these catch a bad line before anything is sent).
COUNT = ("int", 0, None, False)  # kind, minimum, maximum, may be null
READING = ("float", 0, None, True)
FIELDS: dict[str, tuple] = {
    "seq": COUNT,
    "step": COUNT,
    "tokens": COUNT,
    "rank": ("int", 0, 65535, False),
    "micro_batch": ("int", 0, None, True),
    "util_pct": ("float", 0, 100, True),
    "overlap_ratio": ("float", 0, 1, True),
    "loss": ("float", None, None, True),
    "temperature_c": ("float", None, None, True),
    **dict.fromkeys(
        (
            "mem_used_mb",
            "mem_total_mb",
            "power_w",
            "energy_j",
            "step_time_s",
            "tokens_per_s",
            "mfu",
            "sm_clock_mhz",
        ),
        READING,
    ),
    "estimated": ("bool", None, None, False),
    "counter_reset": ("bool", None, None, False),
    "device": ("str", None, 120, False),
    "ts": ("ts", None, None, False),
}


def add_parser(sub) -> None:
    u = sub.add_parser(
        "upload",
        help="Post a finished run trained elsewhere from a JSONL file of its samples "
        "(resumable; priced at the prices of its own time).",
    )
    u.add_argument("file", metavar="FILE.jsonl", help="One telemetry sample per line.")
    u.add_argument("--experiment", type=int, required=True, metavar="ID")
    which = u.add_mutually_exclusive_group(required=True)
    which.add_argument("--arm", metavar="NAME", help="The arm it trained.")
    which.add_argument(
        "--assign",
        action="store_true",
        help="Ask the experiment which arm (POST experiments/ID/assign/: sticky by run key).",
    )
    u.add_argument(
        "--run-key",
        metavar="KEY",
        help="Idempotency key (default: upload-<the file's SHA-256>, so re-running an upload "
        "resumes the same run).",
    )
    u.add_argument(
        "--started-at",
        metavar="ISO",
        help="When it started, ISO 8601 with a zone (default: the first sample's ts).",
    )
    u.add_argument(
        "--ended-at", metavar="ISO", help="When it ended (default: the last sample's ts)."
    )
    u.add_argument("--gpu-sku", metavar="NAME", help="The GPU model held (priced per GPU-hour).")
    u.add_argument(
        "--gpu-count", type=int, metavar="N", help="GPUs held (default 1 with --gpu-sku)."
    )
    u.add_argument("--vcpus", type=int, metavar="N", help="vCPUs held (priced per vCPU-hour).")
    u.add_argument(
        "--memory-gb", type=float, metavar="GB", help="Host memory held (priced per GB-hour)."
    )
    u.add_argument(
        "--resource-id",
        metavar="ID",
        help="The cloud resource it trained on, as the invoice's FOCUS ResourceId names it.",
    )
    u.add_argument(
        "--status",
        choices=["succeeded", "failed", "cancelled"],
        default="succeeded",
        help="How the run ended (succeeded).",
    )
    u.add_argument(
        "--batch", type=int, default=500, metavar="N", help="Samples per POST (500; at most 10000)."
    )
    u.add_argument(
        "--retry-for",
        type=float,
        default=120.0,
        metavar="S",
        help="Ride out an outage of the site for up to S seconds (120); every call is safe to "
        "repeat.",
    )
    u.set_defaults(handler=cmd_upload)


class Sample(dict):
    """A sample as sent, with the line it came from."""

    line: int


def timestamp(value, where: str) -> datetime:
    """An aware datetime from ISO 8601 with a zone or Unix seconds; CliError naming `where`."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise CliError(f"{where}: expected ISO 8601 with a zone or Unix seconds, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise CliError(f"{where}: {value!r} is not a time")
        return datetime.fromtimestamp(value, UTC)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise CliError(f"{where}: {value!r} is not ISO 8601") from None
    if parsed.tzinfo is None:
        raise CliError(f"{where}: {value!r} has no time zone (add Z or an offset)")
    return parsed


def _field_problem(name: str, value) -> str | None:
    kind, low, high, nullable = FIELDS[name]
    if value is None:
        return None if nullable else "may not be null"
    if kind == "bool":
        return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if kind == "str":
        if not isinstance(value, str):
            return f"expected a string, got {value!r}"
        return None if len(value) <= high else f"longer than {high} characters"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number, got {value!r}"
    if kind == "int" and not isinstance(value, int):
        return f"expected an integer, got {value!r}"
    if not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if low is not None and value < low:
        return f"{value!r} is below {low}"
    if high is not None and value > high:
        return f"{value!r} is above {high}"
    return None


def samples_read(path: str) -> tuple[list[Sample], str]:
    """Every sample of the file, sorted by seq, and the file's SHA-256; CliError naming the file,
    the line and the field of the first bad line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    samples: list[Sample] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CliError(f"{where}: not a JSON object ({exc})") from None
        if not isinstance(item, dict):
            raise CliError(f"{where}: expected a JSON object, got {type(item).__name__}")
        for name, value in item.items():
            if name not in FIELDS:
                raise CliError(f"{where}: {name}: not a telemetry field (a typo bills nothing)")
            problem = _field_problem(name, value) if name != "ts" else None
            if problem:
                raise CliError(f"{where}: {name}: {problem}")
        if "ts" not in item:
            raise CliError(f"{where}: ts: required (when the sample was taken)")
        timestamp(item["ts"], f"{where}: ts")
        sample = Sample(item)
        sample.line = number
        samples.append(sample)
    if not samples:
        raise CliError(f"{path}: no samples (one JSON object per line)")
    _seqs_give(samples, path)
    _counters_check(samples, path)
    return samples, hashlib.sha256(data).hexdigest()


def _seqs_give(samples: list[Sample], path: str) -> None:
    """Every line carries a seq, or none does (then line order gives 0, 1, ...); no seq twice.
    Sorted by seq in place."""
    with_seq = [s for s in samples if "seq" in s]
    if with_seq and len(with_seq) != len(samples):
        first = next(s for s in samples if "seq" not in s)
        raise CliError(
            f"{path}:{first.line}: seq: missing, while line {with_seq[0].line} has one "
            "(give seq on every line or on none)"
        )
    if not with_seq:
        for i, sample in enumerate(samples):
            sample["seq"] = i
    seen: dict[int, int] = {}
    for sample in samples:
        if sample["seq"] in seen:
            raise CliError(
                f"{path}:{sample.line}: seq: {sample['seq']} is on line {seen[sample['seq']]} too"
            )
        seen[sample["seq"]] = sample.line
    samples.sort(key=lambda s: s["seq"])


def _counters_check(samples: list[Sample], path: str) -> None:
    """A cumulative counter never falls below the sample before it in its rank, unless the
    sample says counter_reset (the server refuses such a sample alone)."""
    last: dict[int, Sample] = {}
    for sample in samples:
        rank = sample.get("rank", 0)
        before = last.get(rank)
        if before is not None and not sample.get("counter_reset"):
            for name in COUNTERS:
                now, then = sample.get(name), before.get(name)
                if now is not None and then is not None and now < then:
                    raise CliError(
                        f"{path}:{sample.line}: {name}: {now!r} is below {then!r} on line "
                        f'{before.line} (cumulative; say "counter_reset": true if it restarted)'
                    )
        last[rank] = sample


def _window(samples: list[Sample], args, path: str) -> tuple[datetime, datetime | None]:
    """started_at and ended_at (options, else the first and last ts); every sample inside."""
    stamps = [timestamp(s["ts"], "ts") for s in samples]
    started = timestamp(args.started_at, "--started-at") if args.started_at else min(stamps)
    ended = timestamp(args.ended_at, "--ended-at") if args.ended_at else max(stamps)
    if ended < started:
        raise CliError(
            f"--ended-at: {ended.isoformat()} is before started_at {started.isoformat()}"
        )
    for sample, ts in zip(samples, stamps, strict=True):
        if not started <= ts <= ended:
            raise CliError(
                f"{path}:{sample.line}: ts: {ts.isoformat()} is outside the run's window "
                f"{started.isoformat()} .. {ended.isoformat()} (--started-at / --ended-at)"
            )
    # A run of one instant declares no end: the server takes an end only after the start.
    return started, ended if ended > started else None


def _arm(api: Api, args, run_key: str) -> tuple[int, str]:
    if args.assign:
        given = api.post(
            f"experiments/{args.experiment}/assign/", {"run_key": run_key}, idempotent=True
        )
        return given["arm"]["id"], "sticky" if given["sticky"] else "assigned"
    found = api.get("arms/", experiment=args.experiment, name=args.arm)["results"]
    if not found:
        try:
            api.get(f"experiments/{args.experiment}/")
        except CliError as exc:
            if exc.status == 404:
                raise CliError(
                    f"--experiment: there is no experiment {args.experiment} (for this token's "
                    "tenant)"
                ) from None
            raise
        raise CliError(f"--arm: experiment {args.experiment} has no arm named '{args.arm}'")
    return found[0]["id"], "named"


def _batch_send(api: Api, run_id: int, batch: list[Sample], path: str) -> tuple[int, list[str]]:
    """Post one batch: (samples stored now, the refusals as FILE:LINE: field: reason)."""
    try:
        answer = api.post(f"runs/{run_id}/telemetry/", {"samples": batch}, idempotent=True)
    except CliError as exc:
        found = re.match(r"samples\[(\d+)\](\.\w+)?: (.*)", exc.reason or "")
        if exc.status == 400 and found and int(found.group(1)) < len(batch):
            sample = batch[int(found.group(1))]
            field = (found.group(2) or ".sample")[1:]
            raise CliError(
                f"{path}:{sample.line}: {field}: {found.group(3)} (refused by the server)"
            ) from None
        raise
    refusals = []
    for refused in answer.get("refused") or []:
        index, reason = refused.get("index", -1), refused.get("reason", "refused")
        field = str(refused.get("field", "")).rpartition(".")[2] or "sample"
        line = batch[index].line if 0 <= index < len(batch) else "?"
        refusals.append(f"{path}:{line}: {field}: {reason}")
    return answer.get("inserted", 0), refusals


def _finish(api: Api, run_id: int, status: str) -> dict:
    """End the run; a finish that landed before a lost answer is not a failure."""
    try:
        if status == "cancelled":
            return api.post(f"runs/{run_id}/cancel/", {}, idempotent=True)
        return api.post(f"runs/{run_id}/finish/", {"status": status}, idempotent=True)
    except CliError as exc:
        if exc.status != 409:
            raise
        run = api.get(f"runs/{run_id}/")
        if run["status"] != status:
            raise
        return run


def cmd_upload(api: Api, args) -> int:
    path = args.file
    if not 1 <= args.batch <= BATCH_MAX:
        raise CliError(f"--batch: 1 to {BATCH_MAX} samples, got {args.batch}")
    samples, digest = samples_read(path)
    started, ended = _window(samples, args, path)
    run_key = args.run_key or f"upload-{digest}"
    arm_id, how = _arm(api, args, run_key)
    body = {
        "experiment": args.experiment,
        "arm": arm_id,
        "run_key": run_key,
        "kind": "external",
        "started_at": started.isoformat(),
    }
    if ended is not None:
        body["ended_at"] = ended.isoformat()
    for name in ("gpu_sku", "gpu_count", "vcpus", "memory_gb", "resource_id"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    run = api.post("runs/", body, idempotent=True)  # the run key returns the same run
    run_id, last_seq = run["id"], run.get("last_seq", -1)
    missing = [s for s in samples if s["seq"] > last_seq]
    resumed = f", resuming after seq {last_seq}" if last_seq >= 0 else ""
    print(
        f"run {run_id} on arm '{run['arm']['name']}' ({how}) of experiment {args.experiment}"
        f"{resumed}",
        flush=True,
    )
    if run["status"] != "running":
        if missing:
            raise CliError(
                f"run {run_id} is {run['status']} with samples up to seq {last_seq}; "
                f"{len(missing)} of {path} were never sent (use another --run-key to upload anew)"
            )
        print(f"run {run_id}: already uploaded and {run['status']}; nothing sent")
        return 0
    inserted, refusals = 0, []
    for start in range(0, len(missing), args.batch):
        stored, refused = _batch_send(api, run_id, missing[start : start + args.batch], path)
        inserted += stored
        refusals += refused
    if refusals:
        shown = "; ".join(refusals[:3]) + (f" (and {len(refusals) - 3} more)" * (len(refusals) > 3))
        raise CliError(
            f"the server refused {len(refusals)} samples: {shown}; run {run_id} is left running "
            "without them (resend them corrected to POST /api/v1/runs/ID/telemetry/, then finish)"
        )
    run = _finish(api, run_id, args.status)
    print(
        f"run {run_id}: {run['status']} · {len(samples)} samples ({len(missing)} sent now, "
        f"{inserted} of them new; {len(samples) - len(missing)} already stored) · "
        f"{run['steps']} steps · "
        f"{run['tokens']:,} tokens · {float(run['cost_usd']):.6f} USD"
    )
    return 0
