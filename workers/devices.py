"""A training worker's devices: profiled when the worker starts and on demand, recorded for the
platform (apps.devices), and the profile a run trains on.

The profile decides what `precision.compute_dtype: auto` becomes and what the authoring warnings
say. A device that cannot be profiled (a GPU error) is recorded with the reason; the worker
still starts, and runs that name their dtype train as before.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys

from django.conf import settings

from apps.core.db import db_retry
from apps.core.queues import CeleryQueue
from apps.devices.models import DeviceMeasurement
from apps.devices.selectors import device_measurement_latest
from apps.devices.services import device_profile_record

logger = logging.getLogger("costlab.devices")

TRAINING_QUEUES = {CeleryQueue.CPU.value, CeleryQueue.GPU.value}


def worker_devices(queues: list[str]) -> list[str]:
    """The devices a worker on these queues trains on: the CPU for the cpu queue, each CUDA
    device for the gpu queue."""
    import torch

    out = ["cpu"] if CeleryQueue.CPU in queues else []
    if CeleryQueue.GPU in queues and torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return out


def _label(device: str) -> str:
    import torch

    from gpu_runtime.capability import device_label

    return device_label(torch.device(device))


def _measure_in_subprocess(device: str, budget_s: float | None) -> dict:
    """`python -m gpu_runtime profile --json` in a process of its own: the worker's main process
    forks its pool's children, and a process that ran OpenMP kernels before a fork can hang
    them."""
    command = [sys.executable, "-m", "gpu_runtime", "profile", "--device", device, "--json"]
    if budget_s is not None:
        command += ["--budget", str(budget_s)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if out.returncode:
        raise RuntimeError((out.stderr.strip().splitlines() or ["no output"])[-1][:2000])
    return json.loads(out.stdout.strip().splitlines()[-1])


def device_measure(
    *, device: str, queues: list[str], host: str | None = None, in_process: bool = True
):
    """Profile one device and record it; the DeviceMeasurement, or None (the reason recorded).
    `in_process=False` measures in a child process (the worker's main process)."""
    from gpu_runtime.profile import ProfileError, measure_profile

    host = host or socket.gethostname()
    budget = settings.COSTLAB_DEVICE_PROFILE_BUDGET_S
    profile, error = None, ""
    try:
        label = _label(device)
        if in_process:
            profile = measure_profile(device, budget_s=budget).as_dict()
        else:
            profile = _measure_in_subprocess(device, budget)
            profile.pop("best_dtype", None), profile.pop("warnings", None)
    except (ProfileError, RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        label = locals().get("label", device)
        error = f"{type(exc).__name__}: {exc}"
        logger.warning("device %s on %s could not be profiled: %s", label, host, error)
    recorded = db_retry(
        device_profile_record,
        what=f"device {label}: profile record",
        host=host,
        label=label,
        queues=queues,
        profile=profile,
        error=error,
    )
    return recorded.latest if profile is not None else None


def devices_measure(
    *, queues: list[str], in_process: bool = True
) -> list[DeviceMeasurement | None]:
    """Profile every device of a worker on `queues` (at its start, or asked to again)."""
    queues = sorted(set(queues) & TRAINING_QUEUES)
    return [
        device_measure(device=d, queues=queues, in_process=in_process)
        for d in worker_devices(queues)
    ]


def run_profile(*, host: str, device: str, queue: str) -> DeviceMeasurement | None:
    """The measurement a run on `device` trains on: this host's latest, else one taken now."""
    import torch

    if device == "cuda":  # a DDP run: its ranks' GPUs are alike; the current one stands for them
        device = f"cuda:{torch.cuda.current_device()}"
    label = _label(device)
    latest = db_retry(
        device_measurement_latest, what=f"device {label}: profile", host=host, label=label
    )
    if latest is not None and latest.torch_version == torch.__version__:
        return latest
    return device_measure(device=device, queues=[queue], host=host)
