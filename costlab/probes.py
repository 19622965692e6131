"""Reading one device: NVML for an NVIDIA GPU, the process's CPU time (and RAPL where readable)
on a CPU. A probe reports what it can and None for what it cannot; modelled power says so
(``estimated``).

Neither needs torch: a GPU is found through CUDA_VISIBLE_DEVICES and the local rank, matched to
NVML by UUID where the visible list names UUIDs (or where torch, already imported by the
training, gives the device's UUID), else by index.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from costlab.gpm import GpmSampler

log = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclass(frozen=True)
class Reading:
    util_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    power_w: float | None = None
    energy_j: float | None = None  # a monotonic counter's value (J), not yet relative to the start
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
    """This process on the CPU: its share of the cores it may use (CPU time over wall time), its
    resident memory, and RAPL energy, or power modelled as TDP x utilisation (estimated)."""

    label = "cpu"

    def __init__(self, *, tdp_w: float, rapl_root: str | os.PathLike[str] = "/sys/class/powercap"):
        self.tdp_w = tdp_w
        self.cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
        try:
            import psutil

            self._process = psutil.Process()
            self.mem_total_mb: float | None = psutil.virtual_memory().total / MIB
        except ImportError:  # psutil is optional: /proc where there is one
            self._process = None
            self.mem_total_mb = _sysconf_memory_mb()
        self.rapl = RaplCounter(rapl_root)
        self.estimated = not self.rapl.available
        if self.rapl.available:
            self.rapl.read_j()
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def read(self) -> Reading:
        cpu, wall = time.process_time(), time.perf_counter()
        dt = wall - self._wall
        util = min(100.0, 100.0 * (cpu - self._cpu) / (dt * self.cores)) if dt > 0 else 0.0
        self._cpu, self._wall = cpu, wall
        energy = power = None
        if self.rapl.available:
            energy = self.rapl.read_j()
        else:
            power = self.tdp_w * util / 100.0
        return Reading(
            util_pct=max(0.0, util),
            mem_used_mb=self._rss_mb(),
            mem_total_mb=self.mem_total_mb,
            power_w=power,
            energy_j=energy,
        )

    def _rss_mb(self) -> float | None:
        if self._process is not None:
            return self._process.memory_info().rss / MIB
        try:
            pages = int(Path("/proc/self/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return pages * os.sysconf("SC_PAGE_SIZE") / MIB

    def close(self) -> None:
        pass


def _sysconf_memory_mb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MIB
    except (ValueError, OSError, AttributeError):
        return None


class NvmlProbe:
    """One GPU through NVML; counters the driver lacks read as None."""

    estimated = False

    def __init__(self, nvml, handle, *, label: str):
        self.nvml, self.handle, self.label = nvml, handle, label
        self.has_energy = self._call("nvmlDeviceGetTotalEnergyConsumption") is not None
        self.estimated = not self.has_energy and self._call("nvmlDeviceGetPowerUsage") is None
        # SM occupancy, tensor-pipe activity, DRAM bandwidth (Hopper and later; None elsewhere).
        self.gpm = GpmSampler(nvml, handle)

    def _call(self, name: str, *args):
        try:
            return getattr(self.nvml, name)(self.handle, *args)
        except self.nvml.NVMLError:
            return None

    def read(self) -> Reading:
        util = self._call("nvmlDeviceGetUtilizationRates")
        mem = self._call("nvmlDeviceGetMemoryInfo")
        power_mw = self._call("nvmlDeviceGetPowerUsage")
        energy_mj = self._call("nvmlDeviceGetTotalEnergyConsumption") if self.has_energy else None
        clock = self._call("nvmlDeviceGetClockInfo", self.nvml.NVML_CLOCK_SM)
        temp = self._call("nvmlDeviceGetTemperature", self.nvml.NVML_TEMPERATURE_GPU)
        gpm = self.gpm.read()
        return Reading(
            util_pct=None if util is None else float(util.gpu),
            mem_used_mb=None if mem is None else mem.used / MIB,
            mem_total_mb=None if mem is None else mem.total / MIB,
            power_w=None if power_mw is None else power_mw / 1000.0,
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
            sm_clock_mhz=None if clock is None else float(clock),
            temperature_c=None if temp is None else float(temp),
            sm_occupancy_pct=gpm.sm_occupancy_pct,
            tensor_active_pct=gpm.tensor_active_pct,
            dram_bw_pct=gpm.dram_bw_pct,
        )

    def close(self) -> None:
        self.gpm.close()
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def open_probe(device: str | None, *, local_rank: int, cpu_tdp_w: float) -> CpuProbe | NvmlProbe:
    """The probe of this rank's device. `device`: "cpu"; "cuda" or "cuda:N" (the N-th visible GPU,
    default the local rank's); a GPU UUID ("GPU-..."); None or "auto": this local rank's visible
    GPU when NVML finds one, else the CPU."""
    spec = (device or "auto").strip()
    if spec == "cpu" or spec.startswith(("mps", "xpu", "meta")):
        return CpuProbe(tdp_w=cpu_tdp_w)
    if spec.startswith(("GPU-", "MIG-")):
        probe = _nvml_probe(uuid=spec, label=f"cuda {spec}")
    else:
        index = local_rank
        if spec.startswith("cuda:"):
            index = int(spec.split(":", 1)[1])
        probe = _nvml_probe(visible_index=index)
    if probe is not None:
        return probe
    if spec not in ("auto",):
        log.warning("costlab: no NVML reading for %s: sampling the CPU instead", spec)
    return CpuProbe(tdp_w=cpu_tdp_w)


def _nvml_probe(
    *, visible_index: int | None = None, uuid: str | None = None, label: str | None = None
) -> NvmlProbe | None:
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py is optional: without it the CPU is sampled
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        if uuid is None:
            uuid, index = _visible_device(pynvml, visible_index or 0)
            if uuid is None and index is None:
                pynvml.nvmlShutdown()
                return None
        else:
            index = None
        handle = (
            pynvml.nvmlDeviceGetHandleByUUID(uuid)
            if uuid is not None
            else pynvml.nvmlDeviceGetHandleByIndex(index)
        )
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
    except pynvml.NVMLError as exc:
        log.warning("costlab: NVML cannot open the device (%s): sampling the CPU instead", exc)
        pynvml.nvmlShutdown()
        return None
    return NvmlProbe(pynvml, handle, label=label or f"cuda:{visible_index or 0} {name}")


def _visible_device(nvml, visible_index: int) -> tuple[str | None, int | None]:
    """(UUID, None) or (None, NVML index) of the visible_index-th GPU this process sees; (None,
    None) when it sees fewer."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = []
        for entry in (e.strip() for e in visible.split(",")):
            if not entry or entry.startswith("-"):
                break  # CUDA ignores every entry from the first invalid one on
            entries.append(entry)
        if len(entries) == 1:
            visible_index = 0  # one GPU per rank (srun --gpus-per-task=1): whatever the local rank
        if visible_index >= len(entries):
            return None, None
        entry = entries[visible_index]
        if not entry.isdigit():
            return entry, None
        physical = int(entry)
    else:
        if visible_index >= nvml.nvmlDeviceGetCount():
            return None, None
        physical = visible_index
    # CUDA numbers devices fastest first, NVML by PCI bus: the same order on a host of one model.
    # Where the training already imported torch, its device UUID settles it.
    uuid = _torch_uuid(visible_index)
    return (uuid, None) if uuid else (None, physical)


def _torch_uuid(index: int) -> str | None:
    torch = sys.modules.get("torch")  # never imported here: only read when the training did
    if torch is None or not getattr(torch, "cuda", None) or not torch.cuda.is_initialized():
        return None
    try:
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    except Exception:  # an index torch does not know: fall back to NVML's numbering
        return None
    return (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else None
