"""Reading a device's utilisation, memory, power and energy: NVML on NVIDIA, psutil/RAPL on CPU.

A probe reports what it can and None for what it cannot; it never guesses silently.
The CPU probe without a readable RAPL counter models power as TDP x utilisation and
says so (``estimated = True``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from gpu_runtime.gpm import GpmSampler

log = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclass(frozen=True)
class Reading:
    util_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    power_w: float | None = None
    energy_j: float | None = (
        None  # a monotonic counter's value (J), not yet relative to the run start
    )
    sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    # NVML GPM (Hopper and later), in %; None where the device or driver has none.
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_bw_pct: float | None = None


class RaplCounter:
    """Package energy from Linux powercap (intel-rapl:N), summed over sockets, wrap-safe."""

    def __init__(self, root: str | os.PathLike[str] = "/sys/class/powercap"):
        self.domains: list[tuple[Path, int]] = []
        base = Path(root)
        for d in sorted(base.glob("intel-rapl:*")) if base.is_dir() else []:
            if d.name.count(":") != 1:  # sub-domains (core, dram) are inside the package figure
                continue
            try:
                int((d / "energy_uj").read_text())
                max_range = int((d / "max_energy_range_uj").read_text())
            except (OSError, ValueError):
                continue
            self.domains.append((d / "energy_uj", max_range))
        self._last: list[int] | None = None
        self._total_uj = 0

    @property
    def available(self) -> bool:
        return bool(self.domains)

    def read_j(self) -> float:
        raw = [int(path.read_text()) for path, _ in self.domains]
        if self._last is not None:
            for (_, max_range), now, before in zip(self.domains, raw, self._last, strict=True):
                self._total_uj += now - before if now >= before else now + max_range - before
        self._last = raw
        return self._total_uj / 1e6


class CpuProbe:
    """This process on the CPU: utilisation of the cores it may use, RSS, RAPL or modelled power."""

    label = "cpu"

    def __init__(self, *, tdp_w: float, rapl_root: str | os.PathLike[str] = "/sys/class/powercap"):
        self.tdp_w = tdp_w
        self.process = psutil.Process()
        self.cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
        self.process.cpu_percent(None)  # the first call only primes the counter
        self.mem_total_mb = psutil.virtual_memory().total / MIB
        self.rapl = RaplCounter(rapl_root)
        self.estimated = not self.rapl.available
        if self.rapl.available:
            self.rapl.read_j()

    def read(self) -> Reading:
        util = min(100.0, self.process.cpu_percent(None) / self.cores)
        energy = power = None
        if self.rapl.available:
            energy = self.rapl.read_j()
        else:
            power = self.tdp_w * util / 100.0
        return Reading(
            util_pct=util,
            mem_used_mb=self.process.memory_info().rss / MIB,
            mem_total_mb=self.mem_total_mb,
            power_w=power,
            energy_j=energy,
        )

    def close(self) -> None:
        pass


class NvmlProbe:
    """One CUDA device through NVML; counters the driver lacks read as None."""

    def __init__(self, device: torch.device):
        import pynvml

        self.nvml = pynvml
        self.device = device
        self.label = f"cuda:{device.index} {torch.cuda.get_device_name(device.index)}"
        self.handle = None
        try:
            pynvml.nvmlInit()
            self.handle = self._handle(device.index)
        except pynvml.NVMLError as exc:
            log.warning("NVML unavailable (%s): GPU power and utilisation will be missing", exc)
        self.has_energy = self._call("nvmlDeviceGetTotalEnergyConsumption") is not None
        # SM occupancy, tensor-pipe activity, DRAM bandwidth (Hopper and later; None elsewhere).
        self.gpm = GpmSampler(pynvml, self.handle) if self.handle is not None else None
        self.estimated = self.handle is None or (
            not self.has_energy and self._call("nvmlDeviceGetPowerUsage") is None
        )

    def _handle(self, index: int):
        # CUDA_VISIBLE_DEVICES renumbers devices; NVML does not. Match by UUID, then by index.
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
        if uuid:
            for candidate in (uuid, f"GPU-{uuid}"):
                try:
                    return self.nvml.nvmlDeviceGetHandleByUUID(candidate)
                except self.nvml.NVMLError:
                    continue
        return self.nvml.nvmlDeviceGetHandleByIndex(index)

    def _call(self, name: str, *args):
        if self.handle is None:
            return None
        try:
            return getattr(self.nvml, name)(self.handle, *args)
        except self.nvml.NVMLError:
            return None

    def read(self) -> Reading:
        util = self._call("nvmlDeviceGetUtilizationRates")
        mem = self._call("nvmlDeviceGetMemoryInfo")
        if mem is not None:
            used, total = mem.used / MIB, mem.total / MIB
        else:
            free, total_b = torch.cuda.mem_get_info(self.device)
            used, total = (total_b - free) / MIB, total_b / MIB
        power_mw = self._call("nvmlDeviceGetPowerUsage")
        energy_mj = self._call("nvmlDeviceGetTotalEnergyConsumption") if self.has_energy else None
        clock = self._call("nvmlDeviceGetClockInfo", self.nvml.NVML_CLOCK_SM)
        temp = self._call("nvmlDeviceGetTemperature", self.nvml.NVML_TEMPERATURE_GPU)
        gpm = self.gpm.read() if self.gpm is not None else None
        return Reading(
            util_pct=None if util is None else float(util.gpu),
            mem_used_mb=used,
            mem_total_mb=total,
            power_w=None if power_mw is None else power_mw / 1000.0,
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
            sm_clock_mhz=None if clock is None else float(clock),
            temperature_c=None if temp is None else float(temp),
            sm_occupancy_pct=None if gpm is None else gpm.sm_occupancy_pct,
            tensor_active_pct=None if gpm is None else gpm.tensor_active_pct,
            dram_bw_pct=None if gpm is None else gpm.dram_bw_pct,
        )

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()
        if self.handle is not None:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass


def open_probe(device: torch.device, *, cpu_tdp_w: float) -> CpuProbe | NvmlProbe:
    return NvmlProbe(device) if device.type == "cuda" else CpuProbe(tdp_w=cpu_tdp_w)
