"""What this device is and how fast each dtype really runs on it: the device profile.

A CPU without native bf16 (AVX2 only: no avx512_bf16, no AMX) emulates bf16 matmuls at
1/30 to 1/60 of fp32; one with AMX runs them ~4x faster than fp32. The profile reads the
hardware (``/proc/cpuinfo``, NVML) and times a few GEMMs at a transformer's shapes, so
``precision.compute_dtype: auto`` can pick the dtype that is cheap *here*
(:func:`best_dtype`) and a strategy asking for a dear one can be warned (:func:`dtype_warning`).

``measure_profile(torch.device("cpu"))`` takes about 2 s on 2 cores; a GPU about 1 s
after its context is up. Nothing here imports Django: ``python -m gpu_runtime profile``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import platform
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu_runtime.capability import device_label

PROFILE_VERSION = 1
DTYPES = ("fp32", "bf16", "fp16", "int8")
FLOAT_DTYPES = ("fp32", "bf16", "fp16")
TORCH_FLOAT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# (M tokens, K in, N out): the tiny/small presets' projections on a CPU, TinyLlama-1.1B's on
# a GPU (a GPU at the CPU shapes only measures kernel launches).
CPU_SHAPES: tuple[tuple[int, int, int], ...] = ((2048, 256, 768), (2048, 512, 512))
CUDA_SHAPES: tuple[tuple[int, int, int], ...] = ((8192, 2048, 5632), (8192, 2048, 2048))
PROBE_ROWS = 64  # rows of the first, small call that tells whether the full shape fits
DEFAULT_BUDGET_S = {"cpu": 2.0, "cuda": 0.8}
# Throughput against the GEMM's rows (micro-batch x seq_len) at the first shape's K and N: where
# it stops rising is the micro-batch ceiling past which a larger micro-batch buys little
# (``optimizer.dynamic_batching.max_micro_batch: auto``). Timed after the dtypes, in the last
# share of the budget.
CPU_ROWS = (64, 128, 256, 512, 1024, 2048)
CUDA_ROWS = (512, 1024, 2048, 4096, 8192)
ROWS_SHARE = 0.2
SATURATED = 0.9  # rows whose GFLOP/s reach this share of the curve's best have saturated
CPU_COPY_BYTES = 64 * 2**20
CUDA_COPY_BYTES = 512 * 2**20
MIB = 2**20

BEST_MARGIN = 1.1  # a dtype must beat fp32 by this much to be worth the switch
WARN_RATIO = 0.9
EMULATED_RATIO = 0.5  # below this a "native" dtype measured like an emulated one

# The CPU flags that decide how fast a dtype runs (x86 /proc/cpuinfo "flags", arm64 "Features").
RELEVANT_CPU_FLAGS = frozenset(
    {
        "avx2",
        "avx512f",
        "avx512_bf16",
        "avx512_fp16",
        "avx512_vnni",
        "avx_vnni",
        "amx_bf16",
        "amx_fp16",
        "amx_int8",
        "asimdhp",
        "bf16",
        "i8mm",
        "sve",
    }
)
# dtype -> the flags any one of which makes it native, and the words for "none of them".
CPU_NATIVE_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "bf16": (("avx512_bf16", "amx_bf16", "bf16"), "no avx512_bf16/amx_bf16"),
    "fp16": (("avx512_fp16", "amx_fp16", "asimdhp"), "no avx512_fp16/amx_fp16"),
    "int8": (("amx_int8", "avx512_vnni", "avx_vnni", "i8mm"), "no amx_int8/avx512_vnni/avx_vnni"),
}
# dtype -> the lowest CUDA compute capability with native (tensor core) support.
CUDA_NATIVE_CC: dict[str, tuple[int, int]] = {"bf16": (8, 0), "fp16": (7, 0), "int8": (7, 5)}


class ProfileError(RuntimeError):
    """The device as a whole could not be profiled (absent, CUDA error, fp32 GEMM failing)."""


@dataclass(frozen=True)
class DtypeResult:
    """One dtype's GEMM throughput on the device and whether the hardware runs it natively.

    ``gflops`` is GFLOP/s (GOP/s for int8): the harmonic mean over ``shapes``, each shape
    at its fastest iteration. ``flags_native`` is what the CPU flags or compute capability
    say; ``native`` is the verdict (a "native" dtype measured below 0.5x fp32 is not), and
    ``emulated`` its opposite. ``error`` says why it was not measured ("no kernel: ...").
    """

    dtype: str
    gflops: float | None = None
    ratio_vs_fp32: float | None = None
    native: bool = False
    flags_native: bool = False
    emulated: bool = True
    reason: str = ""
    error: str | None = None
    shapes: tuple[tuple[int, int, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shapes"] = [list(s) for s in self.shapes]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DtypeResult:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["shapes"] = tuple(tuple(int(v) for v in s) for s in known.get("shapes", ()))
        return cls(**known)


@dataclass(frozen=True)
class DeviceProfile:
    """What the device is and what each dtype costs on it; ``as_dict()`` is plain JSON.

    ``device_class`` groups comparable hardware: ``cpu:<model>|<sorted relevant flags>``
    or ``cuda:<name>``.
    """

    host: str = ""
    device: str = "cpu"
    device_label: str = "cpu"
    device_class: str = "cpu:unknown|"
    cpu_model: str = ""
    cpu_flags: tuple[str, ...] = ()
    torch_version: str = ""
    threads: int = 0
    cuda_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    total_memory_mib: int | None = None
    power_limit_w: float | None = None
    gpm_supported: bool = False
    memory_bandwidth_gbs: float | None = None
    dtypes: dict[str, DtypeResult] = field(default_factory=dict)
    # dtype -> ((rows, GFLOP/s), ...) at (K, N) = rows_kn: throughput against the micro-batch
    rows_gflops: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    rows_kn: tuple[int, int] | None = None
    notes: tuple[str, ...] = ()
    budget_s: float = 0.0
    elapsed_s: float = 0.0
    measured_at: str = ""
    version: int = PROFILE_VERSION

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["cpu_flags"] = list(self.cpu_flags)
        out["compute_capability"] = (
            None if self.compute_capability is None else list(self.compute_capability)
        )
        out["dtypes"] = {name: r.as_dict() for name, r in self.dtypes.items()}
        out["rows_gflops"] = {
            name: [[r, g] for r, g in curve] for name, curve in self.rows_gflops.items()
        }
        out["rows_kn"] = None if self.rows_kn is None else list(self.rows_kn)
        out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceProfile:
        """The inverse of ``as_dict``; keys it does not know (``best_dtype``...) are ignored."""
        version = data.get("version", PROFILE_VERSION)
        if version != PROFILE_VERSION:
            raise ValueError(
                f"device profile version {version!r}; this code reads {PROFILE_VERSION}"
            )
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["cpu_flags"] = tuple(known.get("cpu_flags", ()))
        cc = known.get("compute_capability")
        known["compute_capability"] = None if cc is None else (int(cc[0]), int(cc[1]))
        known["dtypes"] = {
            name: DtypeResult.from_dict(r) for name, r in known.get("dtypes", {}).items()
        }
        known["rows_gflops"] = {
            name: tuple((int(r), float(g)) for r, g in curve)
            for name, curve in (known.get("rows_gflops") or {}).items()
        }
        kn = known.get("rows_kn")
        known["rows_kn"] = None if kn is None else (int(kn[0]), int(kn[1]))
        known["notes"] = tuple(known.get("notes", ()))
        return cls(**known)


# --- classification: pure functions of what was read and measured -------------------------

Measured = Mapping[str, "float | str | None"]  # dtype -> GFLOP/s, or an error string


def cpu_device_class(model: str, flags: Iterable[str]) -> str:
    relevant = sorted(set(flags) & RELEVANT_CPU_FLAGS)
    return f"cpu:{model}|{','.join(relevant)}"


def _classify(
    flags_native: Mapping[str, tuple[bool, str]],
    measured: Measured,
    shapes: Mapping[str, tuple[tuple[int, int, int], ...]] | None,
) -> tuple[dict[str, DtypeResult], list[str]]:
    notes: list[str] = []
    base = measured.get("fp32")
    fp32 = base if isinstance(base, (int, float)) and base > 0 else None
    results: dict[str, DtypeResult] = {}
    for name in DTYPES:
        if name not in measured and name != "fp32":
            continue
        value = measured.get(name)
        says_native, reason = flags_native.get(name, (True, ""))
        gflops = float(value) if isinstance(value, (int, float)) else None
        error = value if isinstance(value, str) else None
        if gflops is None and error is None:
            error = "not measured"
        ratio = None if gflops is None or fp32 is None else gflops / fp32
        native = says_native
        if name != "fp32" and ratio is not None:
            if says_native and ratio < EMULATED_RATIO:
                native = False
                notes.append(
                    f"{name}: {reason or 'the hardware'} says native, but it measured "
                    f"{ratio:.2f}x fp32: treated as emulated"
                )
            elif not says_native and ratio >= 1.0:
                notes.append(
                    f"{name}: measured {ratio:.2f}x fp32 though not native ({reason}); "
                    "kept as not native"
                )
        results[name] = DtypeResult(
            dtype=name,
            gflops=gflops,
            ratio_vs_fp32=ratio,
            native=native,
            flags_native=says_native,
            emulated=not native,
            reason=reason,
            error=error,
            shapes=tuple((shapes or {}).get(name, ())),
        )
    return results, notes


def classify_cpu(
    model: str,
    flags: Iterable[str],
    measured: Measured,
    *,
    shapes: Mapping[str, tuple[tuple[int, int, int], ...]] | None = None,
) -> tuple[dict[str, DtypeResult], list[str]]:
    """Per dtype: native by the CPU's flags, then demoted if it measured < 0.5x fp32.

    bf16 is native iff avx512_bf16 or amx_bf16 (arm64: bf16); fp16 iff avx512_fp16 or
    amx_fp16 (arm64: asimdhp); int8 iff amx_int8, avx512_vnni, avx_vnni (arm64: i8mm).
    ``measured`` maps a dtype to its GFLOP/s or an error string. Returns the results and
    notes saying where the measurement overruled the flags.
    """
    del model  # the verdict is the flags' and the clock's; the model only names the class
    have = set(flags)
    verdicts: dict[str, tuple[bool, str]] = {"fp32": (True, "")}
    for name, (native_flags, lacking) in CPU_NATIVE_FLAGS.items():
        present = [f for f in native_flags if f in have]
        verdicts[name] = (True, "/".join(present)) if present else (False, lacking)
    return _classify(verdicts, measured, shapes)


def classify_cuda(
    capability: tuple[int, int],
    measured: Measured,
    *,
    shapes: Mapping[str, tuple[tuple[int, int, int], ...]] | None = None,
) -> tuple[dict[str, DtypeResult], list[str]]:
    """bf16 native iff compute capability >= 8.0, fp16 >= 7.0, int8 >= 7.5; then measured."""
    cc = tuple(capability)
    verdicts: dict[str, tuple[bool, str]] = {"fp32": (True, "")}
    for name, need in CUDA_NATIVE_CC.items():
        op = ">=" if cc >= need else "<"
        verdicts[name] = (
            cc >= need,
            f"compute capability {cc[0]}.{cc[1]} {op} {need[0]}.{need[1]}",
        )
    return _classify(verdicts, measured, shapes)


def best_dtype(profile: DeviceProfile) -> str:
    """The fastest of fp32/bf16/fp16 that runs natively here and beats fp32 by >= 1.1x."""
    best = "fp32"
    fp32 = profile.dtypes.get("fp32")
    if fp32 is None or not fp32.gflops:
        return "fp32"
    best_gflops = fp32.gflops * BEST_MARGIN
    for name in FLOAT_DTYPES[1:]:
        r = profile.dtypes.get(name)
        if r is None or not r.native or r.error or r.gflops is None:
            continue
        if r.gflops >= best_gflops:
            best, best_gflops = name, r.gflops
    return best


def saturation_rows(profile: DeviceProfile, dtype: str) -> tuple[int, str] | None:
    """(the fewest GEMM rows at which ``dtype``'s throughput reaches 90 % of its best, the
    dtype whose curve said so); fp32's curve stands in for a dtype without one. None: the
    profile has no curve (measured before curves were, or the budget ran out)."""
    for name in (dtype, "fp32"):
        curve = profile.rows_gflops.get(name)
        if curve:
            best = max(g for _r, g in curve)
            return min(r for r, g in curve if g >= SATURATED * best), name
    return None


def dtype_warning(profile: DeviceProfile, dtype: str) -> str | None:
    """Why ``dtype`` is dear on this device (slower than 0.9x fp32 or not native), else None.

    e.g. "bf16 runs at 0.03x fp32 on cpu (AMD EPYC 7B13, no avx512_bf16/amx_bf16): expect
    it dearer".
    """
    if dtype == "fp32":
        return None
    r = profile.dtypes.get(dtype)
    if r is None:
        return None
    where = profile.device_label
    reason = r.reason
    if r.flags_native and not r.native:
        reason = f"{reason}, yet it measured at emulated speed".lstrip(", ")
    detail = ", ".join(
        x for x in ((profile.cpu_model if profile.device == "cpu" else ""), reason) if x
    )
    paren = f" ({detail})" if detail else ""
    if r.error:
        return f"{dtype} could not be measured on {where}{paren}: {r.error}"
    ratio = r.ratio_vs_fp32
    if ratio is not None and ratio >= WARN_RATIO and r.native:
        return None
    if ratio is None:
        return None if r.native else f"{dtype} is not native on {where}{paren}: expect it dearer"
    if ratio < 1.0:
        return f"{dtype} runs at {ratio:.2f}x fp32 on {where}{paren}: expect it dearer"
    return (
        f"{dtype} runs at {ratio:.2f}x fp32 on {where}{paren} but is not native here: "
        "the speed may not hold at other shapes"
    )


# --- reading the hardware ------------------------------------------------------------------


def read_cpu_info(path: str | Path = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags (first processor of /proc/cpuinfo; elsewhere
    ``platform.processor()`` and no flags)."""
    model, flags = "", frozenset()
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        if not line.strip():
            if model and flags:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    if not model:
        model = platform.processor() or platform.machine() or "unknown cpu"
    return model, flags


@dataclass(frozen=True)
class NvmlInfo:
    """What NVML says of one GPU; a field it could not read is None (why: ``errors``)."""

    name: str | None = None
    total_memory_mib: int | None = None
    power_limit_w: float | None = None
    compute_capability: tuple[int, int] | None = None
    gpm_supported: bool = False
    errors: tuple[str, ...] = ()


def read_nvml(index: int, nvml: Any = None, *, uuid: str | None = None) -> NvmlInfo:
    """Read GPU ``index`` through NVML (``nvml``: the pynvml module, or a fake in tests).

    The device is found by ``uuid`` when given (CUDA_VISIBLE_DEVICES renumbers devices,
    NVML does not), else by index. Raises ProfileError when NVML cannot start or find the
    device; a field the driver cannot read is None. Memory is MiB, power W (NVML: mW).
    """
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py; only a CUDA host needs it
        except ImportError as exc:
            raise ProfileError(f"NVML unavailable: {exc}") from None
    nvml_error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except nvml_error as exc:
        raise ProfileError(f"NVML unavailable: {exc}") from None
    errors: list[str] = []
    try:
        handle = None
        for candidate in (uuid, f"GPU-{uuid}") if uuid else ():
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(candidate)
                break
            except (nvml_error, AttributeError):
                continue
        if handle is None:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml_error as exc:
                raise ProfileError(f"NVML has no device {index}: {exc}") from None

        def call(name: str) -> Any:
            fn = getattr(nvml, name, None)
            if fn is None:
                errors.append(f"{name}: not in this pynvml")
                return None
            try:
                return fn(handle)
            except nvml_error as exc:
                errors.append(f"{name}: {exc}")
                return None

        raw_name = call("nvmlDeviceGetName")
        if isinstance(raw_name, bytes):
            raw_name = raw_name.decode("utf-8", "replace")
        mem = call("nvmlDeviceGetMemoryInfo")
        power_mw = call("nvmlDeviceGetPowerManagementLimit")
        cc = call("nvmlDeviceGetCudaComputeCapability")
        gpm = None
        if hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            gpm = call("nvmlGpmQueryDeviceSupport")
        return NvmlInfo(
            name=None if raw_name is None else str(raw_name),
            total_memory_mib=None if mem is None else int(mem.total) // MIB,
            power_limit_w=None if power_mw is None else float(power_mw) / 1000.0,
            compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
            gpm_supported=bool(getattr(gpm, "isSupportedDevice", gpm) or False),
            errors=tuple(errors),
        )
    finally:
        try:
            nvml.nvmlShutdown()
        except (nvml_error, AttributeError):
            pass


# --- measuring -----------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _timed(fn: Callable[[], Any], sync: Callable[[], None], calls: int) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn``."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls


def _gemm_inputs(name: str, m: int, k: int, n: int, device: torch.device):
    if name == "int8":
        a = torch.randint(-64, 64, (m, k), dtype=torch.int8, device=device)
        b = torch.randint(-64, 64, (k, n), dtype=torch.int8, device=device)
        c = torch.empty(m, n, dtype=torch.int32, device=device)
        try:
            torch._int_mm(a, b, out=c)
        except (RuntimeError, TypeError):  # a build with the kernel but no out= variant
            return lambda: torch._int_mm(a, b)
        return lambda: torch._int_mm(a, b, out=c)
    dtype = TORCH_FLOAT[name]
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    c = torch.empty(m, n, dtype=dtype, device=device)
    return lambda: torch.mm(a, b, out=c)


@dataclass
class _Gemm:
    """One dtype at one shape while it is being timed."""

    name: str
    rows: int
    k: int
    n: int
    fn: Callable[[], Any]
    calls: int = 1  # per timed batch: enough that a batch outlasts launch overhead
    best: float = math.inf  # fastest seconds per call seen

    @property
    def gflops(self) -> float:
        return 2.0 * self.rows * self.k * self.n / self.best / 1e9


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """Run the block on ``count`` CPU threads (None: as set)."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _rounds(gemms: list[_Gemm], sync: Callable[[], None], until: float, *, most: int) -> None:
    """Time the GEMMs in turn, round after round, each keeping its fastest call."""
    for _ in range(most):
        for g in gemms:
            g.best = min(g.best, _timed(g.fn, sync, g.calls))
        if time.perf_counter() + sum(g.best * g.calls for g in gemms) > until:
            return


def _measure_gemms(
    shapes: tuple[tuple[int, int, int], ...],
    device: torch.device,
    sync: Callable[[], None],
    deadline: float,
    min_batch_s: float,
    on_error: Callable[[str, BaseException], str],
) -> tuple[dict[str, float | str], dict[str, tuple[tuple[int, int, int], ...]]]:
    """Per dtype: GFLOP/s (the harmonic mean over its shapes) and the shapes it was timed at.

    Per shape, within its share of the clock, first the sizing, on one CPU thread (a small
    GEMM on two threads of a busy box waits milliseconds for the second thread, and says
    nothing of the hardware): every dtype runs at PROBE_ROWS rows, and fp32 grows (x4, or
    straight to the full shape) while a call stays under a sixth of the share. Then, on the
    threads asked for, fp32 and every dtype whose probe time scaled up fits too are timed at
    fp32's rows; a slower one at the probe's: an emulated dtype, 1/30 to 1/60 of fp32, is
    as slow per FLOP there, and one full call of it could eat the whole budget.
    Then all take turns, round after round, each keeping its fastest call: on a shared box
    every dtype meets the same neighbours, so the ratios stay fair.
    """
    rates: dict[str, list[float]] = {name: [] for name in DTYPES}
    used: dict[str, list[tuple[int, int, int]]] = {name: [] for name in DTYPES}
    errors: dict[str, str] = {}

    def build(name: str, rows: int, k: int, n: int) -> _Gemm | None:
        try:
            g = _Gemm(name, rows, k, n, _gemm_inputs(name, rows, k, n, device))
            g.fn()  # warm-up: kernel choice, oneDNN primitive creation, cuBLAS handles
            sync()
            return g
        except (RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
            errors[name] = on_error(name, exc)  # raises ProfileError for fp32
            return None

    for i, (m, k, n) in enumerate(shapes):
        left = deadline - time.perf_counter()
        if left <= 0 and rates["fp32"]:
            break
        share_end = time.perf_counter() + max(left, 0.0) / (len(shapes) - i)
        max_call = (share_end - time.perf_counter()) / 6
        rows = min(PROBE_ROWS, m)
        with _threads(1 if device.type == "cpu" else None):
            probes = [g for name in DTYPES if name not in errors and (g := build(name, rows, k, n))]
            _rounds(probes, sync, share_end, most=3)
            fp32 = probes[0]
            while fp32.rows < m and time.perf_counter() < share_end:
                per_row = fp32.best / fp32.rows
                grow = m if per_row * m <= max_call else min(m, fp32.rows * 4)
                bigger = build("fp32", grow, k, n) if per_row * grow <= max_call else None
                if bigger is None:
                    break
                _rounds([bigger], sync, share_end, most=2)
                fp32 = bigger
        gemms = [g for g in (build("fp32", fp32.rows, k, n),) if g is not None]
        for probe in probes[1:]:
            fits = probe.best * fp32.rows / probe.rows <= max_call
            g = build(probe.name, fp32.rows if fits else probe.rows, k, n)
            if g is not None:
                gemms.append(g)
        del probes
        for g in gemms:
            while g.best * g.calls < min_batch_s and g.calls < 4096:
                g.calls *= 2
        _rounds(gemms, sync, share_end, most=10_000)
        for g in gemms:
            if g.name not in errors:
                rates[g.name].append(g.gflops)
                used[g.name].append((g.rows, g.k, g.n))
        del gemms, fp32
    measured: dict[str, float | str] = {}
    for name in DTYPES:
        if name in errors:
            measured[name] = errors[name]
        elif not rates[name]:
            measured[name] = "budget spent before it could be measured"
        else:
            value = len(rates[name]) / sum(1.0 / r for r in rates[name])
            measured[name] = value if math.isfinite(value) else "timing was not finite"
    return measured, {name: tuple(s) for name, s in used.items()}


def _measure_rows(
    names: Iterable[str],
    rows: tuple[int, ...],
    k: int,
    n: int,
    device: torch.device,
    sync: Callable[[], None],
    deadline: float,
    min_batch_s: float,
) -> dict[str, tuple[tuple[int, float], ...]]:
    """Per dtype, GFLOP/s at each row count (smallest first; a row count whose call would not
    fit the time left is not timed): every (dtype, rows) takes turns, as in _measure_gemms."""
    gemms: list[_Gemm] = []
    for name in names:
        for m in rows:
            if time.perf_counter() >= deadline:
                break
            try:
                g = _Gemm(name, m, k, n, _gemm_inputs(name, m, k, n, device))
                t0 = time.perf_counter()
                g.fn()
                sync()
            except (RuntimeError, NotImplementedError, AttributeError, TypeError):
                break  # out of memory at this size: the curve ends here
            g.best = time.perf_counter() - t0
            while g.best * g.calls < min_batch_s and g.calls < 4096:
                g.calls *= 2
            gemms.append(g)
    _rounds(gemms, sync, deadline, most=10_000)
    curves: dict[str, list[tuple[int, float]]] = {}
    for g in gemms:
        if math.isfinite(g.gflops):
            curves.setdefault(g.name, []).append((g.rows, round(g.gflops, 2)))
    return {name: tuple(curve) for name, curve in curves.items()}


def _measure_bandwidth(
    device: torch.device,
    sync: Callable[[], None],
    deadline: float,
    nbytes: int,
    min_batch_s: float,
) -> float:
    """GB/s of a large device-to-device copy (read + write both counted, as STREAM does)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    g = _Gemm("copy", 1, 1, 1, lambda: dst.copy_(src))
    g.fn()  # first touch of dst's pages
    sync()
    g.best = _timed(g.fn, sync, 1)
    while g.best * g.calls < min_batch_s and g.calls < 4096:
        g.calls *= 2
    _rounds([g], sync, deadline, most=50)
    return 2.0 * src.numel() * 4 / g.best / 1e9


def _l3_bytes() -> int | None:
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        return None
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    try:
        return int(text[:-1]) * units[text[-1].upper()] if text[-1].isalpha() else int(text)
    except (ValueError, KeyError, IndexError):
        return None


def _cuda_index(device: torch.device) -> int:
    if not torch.cuda.is_available():
        raise ProfileError(
            f"{device} asked for, but this host has no usable CUDA device "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ProfileError(f"{device} asked for; this host has {count} CUDA devices")
    return index


def _cuda_facts(index: int, device: torch.device, notes: list[str]) -> dict[str, Any]:
    try:
        props = torch.cuda.get_device_properties(index)
        x = torch.ones(64, 64, device=device)  # context and cuBLAS up before the clock starts
        torch.mm(x, x)
        torch.cuda.synchronize(device)
    except RuntimeError as exc:
        raise ProfileError(f"{device}: CUDA failed to start: {_first_line(exc)}") from exc
    info = NvmlInfo()
    try:
        info = read_nvml(index, uuid=str(getattr(props, "uuid", "") or "") or None)
        notes.extend(f"NVML {e}" for e in info.errors)
    except ProfileError as exc:
        notes.append(f"{exc}: name, memory and capability from torch; power limit unknown")
    name = info.name or str(props.name)
    precision = torch.get_float32_matmul_precision()
    tf32 = "TF32 off" if precision == "highest" else "TF32 allowed"
    notes.append(f"fp32 timed at float32_matmul_precision {precision!r} ({tf32})")
    return {
        "cuda_name": name,
        "compute_capability": info.compute_capability or (int(props.major), int(props.minor)),
        "total_memory_mib": info.total_memory_mib or int(props.total_memory) // MIB,
        "power_limit_w": info.power_limit_w,
        "gpm_supported": info.gpm_supported,
        "device_class": f"cuda:{name}",
    }


def measure_profile(
    device: torch.device | str, *, budget_s: float | None = None, threads: int | None = None
) -> DeviceProfile:
    """Read and time ``device`` within about ``budget_s`` seconds (CPU 2 s, GPU 0.8 s after
    its context is up), on ``threads`` CPU threads (default: torch's current setting).

    A dtype that cannot run (no kernel, out of memory) gets an ``error`` in its result;
    a device that cannot be profiled at all (absent, a CUDA error, fp32 failing) raises
    ProfileError naming why.
    """
    started = time.perf_counter()
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ProfileError(f"{device!r} is not a device: {_first_line(exc)}") from None
    if device.type not in ("cpu", "cuda"):
        raise ProfileError(f"{device}: only cpu and cuda devices can be profiled")
    notes: list[str] = []
    cpu_model, flags = read_cpu_info()
    if device.type == "cuda":
        index = _cuda_index(device)
        device = torch.device("cuda", index)
        extra = _cuda_facts(index, device, notes)
        shapes, min_batch_s = CUDA_SHAPES, 0.002

        def sync() -> None:
            torch.cuda.synchronize(device)

        free, _total = torch.cuda.mem_get_info(device)
        copy_bytes = max(min(CUDA_COPY_BYTES, free // 8), 4 * MIB)
    else:
        extra = {"device_class": cpu_device_class(cpu_model, flags)}
        shapes, min_batch_s, copy_bytes = CPU_SHAPES, 0.0002, CPU_COPY_BYTES

        def sync() -> None:
            pass

    def on_error(name: str, exc: BaseException) -> str:
        if device.type == "cuda":
            try:
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
            except RuntimeError as dead:
                raise ProfileError(
                    f"{device}: CUDA error while timing {name}: {_first_line(dead)}"
                ) from exc
        if name == "fp32":
            raise ProfileError(f"{device}: fp32 GEMM failed: {_first_line(exc)}") from exc
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
            return f"out of memory: {_first_line(exc)}"
        return f"no kernel: {_first_line(exc)}"

    budget = DEFAULT_BUDGET_S[device.type] if budget_s is None else float(budget_s)
    with _threads(None if threads is None else max(int(threads), 1)):
        used_threads = torch.get_num_threads()
        clock_start = time.perf_counter()
        bandwidth = None
        try:
            bandwidth = _measure_bandwidth(
                device, sync, clock_start + 0.12 * budget, copy_bytes, min_batch_s
            )
        except RuntimeError as exc:
            on_error("bandwidth", exc)  # a dead CUDA context raises here
            notes.append(f"memory bandwidth not measured: {_first_line(exc)}")
        try:
            measured, used_shapes = _measure_gemms(
                shapes, device, sync, clock_start + (1 - ROWS_SHARE) * budget, min_batch_s, on_error
            )
        except RuntimeError as exc:  # ProfileError is one; a CUDA fault surfaces at a sync
            if isinstance(exc, ProfileError):
                raise
            raise ProfileError(f"{device}: GEMM timing failed: {_first_line(exc)}") from exc
        # The curve for fp32 and every float dtype that ran at least half its speed (an
        # emulated one would spend the share on a few calls, and `auto` never picks it).
        fp32_rate = measured["fp32"] if isinstance(measured["fp32"], float) else math.inf
        fast = [
            name
            for name in FLOAT_DTYPES
            if isinstance(measured.get(name), float)
            and measured[name] >= EMULATED_RATIO * fp32_rate
        ]
        rows_k, rows_n = shapes[0][1], shapes[0][2]
        rows_gflops = _measure_rows(
            fast,
            CUDA_ROWS if device.type == "cuda" else CPU_ROWS,
            rows_k,
            rows_n,
            device,
            sync,
            clock_start + budget,
            min_batch_s,
        )
    if not isinstance(measured["fp32"], float):
        raise ProfileError(f"{device}: fp32 GEMM not measured: {measured['fp32']}")

    if device.type == "cpu":
        l3 = _l3_bytes()
        if l3 is not None and copy_bytes < l3:
            notes.append(
                f"memory bandwidth from a {copy_bytes // MIB} MiB copy, inside the "
                f"{l3 // MIB} MiB L3 (shared with the whole socket): may read high"
            )
    for name, done in used_shapes.items():
        if done and done != shapes[: len(done)]:
            notes.append(
                f"{name} timed at {', '.join('x'.join(map(str, s)) for s in done)}: "
                "the full shapes did not fit the budget"
            )
    if device.type == "cuda":
        dtypes, more = classify_cuda(extra["compute_capability"], measured, shapes=used_shapes)
    else:
        dtypes, more = classify_cpu(cpu_model, flags, measured, shapes=used_shapes)
    return DeviceProfile(
        host=socket.gethostname(),
        device=str(device),
        device_label=device_label(device),
        cpu_model=cpu_model,
        cpu_flags=tuple(sorted(flags & RELEVANT_CPU_FLAGS)),
        torch_version=str(torch.__version__),
        threads=used_threads,
        memory_bandwidth_gbs=bandwidth,
        dtypes=dtypes,
        rows_gflops=rows_gflops,
        rows_kn=(rows_k, rows_n),
        notes=tuple(notes + more),
        budget_s=budget,
        elapsed_s=round(time.perf_counter() - started, 3),
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **extra,
    )
