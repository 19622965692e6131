"""Command line: ``python -m gpu_runtime {train,validate,schema}``.

``train`` writes one JSON line per telemetry sample to ``--out`` and prints the
RunResult as one JSON object on the last line of stdout. Exit status: 0 completed,
2 strategy refused, 143 stopped by SIGTERM (the result is still printed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpu_runtime.errors import StrategyError
from gpu_runtime.schema import config_sha256, load_strategy, strategy_json_schema
from gpu_runtime.yaml_loader import MAX_DOCUMENT_BYTES

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


def _train(ns: argparse.Namespace) -> int:
    from gpu_runtime.result import JsonlSink
    from gpu_runtime.runtime import train

    config = load_strategy(_read_strategy(ns.strategy))
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

    try:
        result = train(
            config,
            sink=sink,
            device=ns.device,
            steps=ns.steps,
            checkpoint_dir=ns.checkpoint_dir,
            resume_from=ns.resume,
        )
    finally:
        if out is not None:
            out.close()
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_runtime", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train with a strategy YAML")
    tr.add_argument("strategy", help="strategy YAML file")
    tr.add_argument("--steps", type=int, help="override train.steps")
    tr.add_argument("--out", help="metrics JSONL: one telemetry sample per line")
    tr.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda:0 if present, else cpu)")
    tr.add_argument(
        "--checkpoint-dir",
        help="write a checkpoint here when the run ends (and every train.checkpoint_every)",
    )
    tr.add_argument("--resume", help="resume from this checkpoint (file or directory)")
    tr.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    tr.set_defaults(handler=_train)
    va = sub.add_parser(
        "validate", help="check a strategy YAML and print it with defaults filled in"
    )
    va.add_argument("strategy")
    va.set_defaults(handler=_validate)
    sc = sub.add_parser("schema", help="print the strategy JSON Schema")
    sc.set_defaults(handler=lambda ns: print(json.dumps(strategy_json_schema(), indent=2)) or 0)
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
