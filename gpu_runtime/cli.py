"""Command line: ``python -m gpu_runtime {train,validate,schema,profile}``.

``train`` writes one JSON line per telemetry sample to ``--out`` and prints the
RunResult as one JSON object on the last line of stdout. With ``eval:`` each held-out
evaluation prints an ``eval`` line on stderr as it happens, and the run's held-out loss and
evaluation time close it. Exit status: 0 completed, 2 strategy refused, 143 stopped by
SIGTERM (the result is still printed).
``validate`` only checks the file. Every command that takes a strategy validates it before
torch is imported, so a bad file is refused in a fraction of a second (importing torch
takes seconds); hardware checks (a dtype this device cannot run) come after, with torch.
``profile`` times the device's GEMMs per dtype and prints a table (``--json``: one object).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_runtime.errors import StrategyError
from gpu_runtime.schema import config_sha256, load_strategy, strategy_json_schema
from gpu_runtime.yaml_loader import MAX_DOCUMENT_BYTES

if TYPE_CHECKING:
    from gpu_runtime.profile import DeviceProfile

EXIT_REFUSED = 2
EXIT_SIGTERM = 143


def _read_strategy(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(
            MAX_DOCUMENT_BYTES + 1
        )  # one byte more is enough for the size check to refuse


def _progress_line(sample: dict[str, Any]) -> str:
    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    energy = fmt(sample["energy_j"], ".1f") + ("~" if sample["estimated"] else "")
    return (
        f"step {sample['step']:>6}  loss {fmt(sample['loss'], '.4f')}  "
        f"{fmt(sample['tokens_per_s'], ',.0f')} tok/s  "
        f"step {fmt(sample['step_time_s'], '.3f')} s  util {fmt(sample['util_pct'], '.0f')} %  "
        f"power {fmt(sample['power_w'], '.1f')} W  energy {energy} J  "
        f"mfu {fmt(sample['mfu'], '.3f')}"
    )


def _eval_line(sample: dict[str, Any]) -> str:
    """An evaluation's line: the held-out loss after this step, and what it cost."""
    loss = "-" if sample["eval_loss"] is None else format(sample["eval_loss"], ".4f")
    return (
        f"eval {sample['step']:>6}  held-out loss {loss}  after {sample['tokens']:,} tokens  "
        f"({sample['eval_s']:.3f} s, billed, not step time)"
    )


def _eval_summary(result: Any) -> str:
    loss = "-" if result.eval_loss is None else format(result.eval_loss, ".4f")
    share = result.eval_s / result.wall_s * 100 if result.wall_s > 0 else 0.0
    return (
        f"held-out loss {loss} after {result.steps} steps; {len(result.evaluations)} "
        f"evaluation{'s' if len(result.evaluations) != 1 else ''} took {result.eval_s:.3f} s of "
        f"the run's {result.wall_s:.1f} s ({share:.1f} %, billed)"
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _train(ns: argparse.Namespace) -> int:
    config = load_strategy(_read_strategy(ns.strategy))  # refuses a bad file before torch loads
    from gpu_runtime.launch import train
    from gpu_runtime.result import JsonlSink

    out = None
    if ns.out:
        if not ns.resume:
            Path(ns.out).write_text("")
        out = JsonlSink(ns.out)

    def sink(sample: dict[str, Any]) -> None:
        if out is not None:
            out(sample)
        if not ns.quiet:
            print(_progress_line(sample), file=sys.stderr, flush=True)
            if "eval_loss" in sample:
                print(_eval_line(sample), file=sys.stderr, flush=True)

    try:
        result = train(
            config,
            sink=sink,
            device=ns.device,
            steps=ns.steps,
            checkpoint_dir=ns.checkpoint_dir,
            resume_from=ns.resume,
            artifacts_dir=ns.artifacts_dir,
        )
    finally:
        if out is not None:
            out.close()
    if config.eval is not None and not ns.quiet:
        print(_eval_summary(result), file=sys.stderr, flush=True)
    print(json.dumps(result.to_dict()), flush=True)
    return EXIT_SIGTERM if result.status == "interrupted" else 0


def _validate(ns: argparse.Namespace) -> int:
    config = load_strategy(_read_strategy(ns.strategy))
    print(
        json.dumps(
            {
                "ok": True,
                "config_sha256": config_sha256(config),
                "config": config.model_dump(mode="json"),
            }
        )
    )
    return 0


def _profile_table(profile: DeviceProfile, best: str, warnings: dict[str, str]) -> str:
    from gpu_runtime.profile import saturation_rows

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    if profile.device == "cpu":
        about = profile.cpu_model
    else:
        cc = ".".join(map(str, profile.compute_capability or ()))
        about = (
            f"compute capability {cc}, {num(profile.total_memory_mib, ',d')} MiB, "
            f"power limit {num(profile.power_limit_w, '.0f')} W, "
            f"GPM {'yes' if profile.gpm_supported else 'no'}"
        )
    lines = [
        f"device     {profile.device_label}  ({about})",
        f"class      {profile.device_class}",
        f"host       {profile.host}, torch {profile.torch_version}, {profile.threads} threads",
        f"memory     {num(profile.memory_bandwidth_gbs, ',.1f')} GB/s (copy)",
        "",
        f"{'dtype':<6} {'GFLOP/s':>10} {'vs fp32':>8}  {'native':<7} why",
    ]
    for name, r in profile.dtypes.items():
        native = "yes" if r.native else ("EMUL" if r.flags_native else "no")
        ratio = "-" if r.ratio_vs_fp32 is None else f"{r.ratio_vs_fp32:.2f}x"
        why = r.error or r.reason
        lines.append(f"{name:<6} {num(r.gflops, ',.1f'):>10} {ratio:>8}  {native:<7} {why}")
    lines += ["", f"best dtype {best}"]
    if profile.rows_kn is not None:
        k, n = profile.rows_kn
        for name, curve in profile.rows_gflops.items():
            points = "  ".join(f"{rows}:{gflops:,.0f}" for rows, gflops in curve)
            lines.append(
                f"rows       {name} at (rows x {k} x {n}): {points} GFLOP/s; 90% of its best "
                f"from {saturation_rows(profile, name)[0]} rows"
            )
    lines += [f"warning    {w}" for w in warnings.values()]
    lines += [f"note       {n}" for n in profile.notes]
    lines.append(f"measured in {profile.elapsed_s:.2f} s (budget {profile.budget_s:.2f} s)")
    return "\n".join(lines)


def _profile(ns: argparse.Namespace) -> int:
    import torch

    from gpu_runtime.profile import ProfileError, best_dtype, dtype_warning, measure_profile

    device = ns.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        profile = measure_profile(device, budget_s=ns.budget, threads=ns.threads)
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    best = best_dtype(profile)
    warnings = {d: w for d in profile.dtypes if (w := dtype_warning(profile, d)) is not None}
    if ns.json:
        print(json.dumps({**profile.as_dict(), "best_dtype": best, "warnings": warnings}))
    else:
        print(_profile_table(profile, best, warnings))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_runtime", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train with a strategy YAML")
    tr.add_argument("strategy", help="strategy YAML file")
    tr.add_argument("--steps", type=_positive_int, help="override train.steps")
    tr.add_argument("--out", help="metrics JSONL: one telemetry sample per line")
    tr.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda:0 if present, else cpu)")
    tr.add_argument(
        "--checkpoint-dir",
        help="write a checkpoint here when the run ends (and every train.checkpoint_every)",
    )
    tr.add_argument("--resume", help="resume from this checkpoint (file or directory)")
    tr.add_argument(
        "--artifacts-dir",
        help="where finetune.save writes the trained adapter or weights (safetensors)",
    )
    tr.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    tr.set_defaults(handler=_train)
    va = sub.add_parser(
        "validate",
        help="check a strategy YAML (no torch) and print it as one JSON line, defaults filled in",
    )
    va.add_argument("strategy")
    va.set_defaults(handler=_validate)
    sc = sub.add_parser("schema", help="print the strategy JSON Schema")
    sc.set_defaults(handler=lambda ns: print(json.dumps(strategy_json_schema(), indent=2)) or 0)
    pr = sub.add_parser(
        "profile", help="time this device's GEMMs per dtype (fp32, bf16, fp16, int8)"
    )
    pr.add_argument("--device", help="cpu or cuda:N (default: cuda:0 if present, else cpu)")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.add_argument(
        "--budget", type=float, help="seconds to spend timing (default: cpu 2, cuda 0.8)"
    )
    pr.add_argument("--threads", type=int, help="CPU threads to time on (default: torch's)")
    pr.set_defaults(handler=_profile)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.handler(ns)
    except StrategyError as exc:
        print(json.dumps({"ok": False, "errors": exc.errors}), file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
