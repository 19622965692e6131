"""The device profile: CPU flags and NVML read right, dtypes classified, timed within budget."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpu_runtime import profile as prof
from gpu_runtime.cli import main
from gpu_runtime.profile import (
    DeviceProfile,
    ProfileError,
    best_dtype,
    classify_cpu,
    classify_cuda,
    cpu_device_class,
    dtype_warning,
    measure_profile,
    read_cpu_info,
    read_nvml,
    saturation_rows,
)

ROOT = Path(__file__).resolve().parents[2]
EPYC = "AMD EPYC 7B13"
EPYC_FLAGS = {"fpu", "sse2", "avx", "avx2", "fma", "f16c", "sha_ni"}  # Zen 3: no avx512 at all
XEON = "Intel(R) Xeon(R) Platinum 8480+"
XEON_FLAGS = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile"}
PROFILE_KEYS = {
    "rows_gflops",
    "rows_kn",
    "host",
    "device",
    "device_label",
    "device_class",
    "cpu_model",
    "cpu_flags",
    "torch_version",
    "threads",
    "cuda_name",
    "compute_capability",
    "total_memory_mib",
    "power_limit_w",
    "gpm_supported",
    "memory_bandwidth_gbs",
    "dtypes",
    "notes",
    "budget_s",
    "elapsed_s",
    "measured_at",
    "version",
}
DTYPE_KEYS = {
    "dtype",
    "gflops",
    "ratio_vs_fp32",
    "native",
    "flags_native",
    "emulated",
    "reason",
    "error",
    "shapes",
}


def cpu_profile(model: str, flags: set[str], measured: dict) -> DeviceProfile:
    dtypes, notes = classify_cpu(model, flags, measured)
    return DeviceProfile(
        device="cpu",
        device_label="cpu",
        device_class=cpu_device_class(model, flags),
        cpu_model=model,
        dtypes=dtypes,
        notes=tuple(notes),
    )


# --- classification -------------------------------------------------------------------------


def test_avx2_epyc_emulates_bf16_so_fp32_is_best_and_bf16_warned():
    p = cpu_profile(
        EPYC, EPYC_FLAGS, {"fp32": 60.0, "bf16": 1.8, "fp16": 1.2, "int8": "no kernel: x"}
    )
    bf16 = p.dtypes["bf16"]
    assert (bf16.native, bf16.flags_native, bf16.emulated) == (False, False, True)
    assert bf16.ratio_vs_fp32 == pytest.approx(0.03)
    assert "no avx512_bf16/amx" in bf16.reason
    assert p.dtypes["int8"].error == "no kernel: x" and p.dtypes["int8"].gflops is None
    assert best_dtype(p) == "fp32"
    warning = dtype_warning(p, "bf16")
    assert warning == (
        "bf16 runs at 0.03x fp32 on cpu (AMD EPYC 7B13, no avx512_bf16/amx_bf16): expect it dearer"
    )
    assert "0.02x" in dtype_warning(p, "fp16") and "no avx512_fp16" in dtype_warning(p, "fp16")
    assert "could not be measured" in dtype_warning(p, "int8")
    assert dtype_warning(p, "fp32") is None
    assert p.device_class == "cpu:AMD EPYC 7B13|avx2"


def test_amx_xeon_runs_bf16_natively_and_picks_it():
    p = cpu_profile(XEON, XEON_FLAGS, {"fp32": 100.0, "bf16": 400.0, "fp16": 120.0, "int8": 900})
    for name in ("bf16", "fp16", "int8"):
        r = p.dtypes[name]
        assert (r.native, r.flags_native, r.emulated) == (True, True, False), name
    assert p.dtypes["bf16"].ratio_vs_fp32 == pytest.approx(4.0)
    assert p.dtypes["bf16"].reason == "avx512_bf16/amx_bf16"
    assert best_dtype(p) == "bf16"  # fp16 is faster than fp32 too, but bf16 is fastest
    assert dtype_warning(p, "bf16") is None and dtype_warning(p, "int8") is None
    assert p.notes == ()
    assert p.device_class == (
        "cpu:Intel(R) Xeon(R) Platinum 8480+|amx_bf16,amx_int8,avx2,avx512_bf16,avx512_fp16,avx512f"
    )


def test_measurement_overrules_flags_that_say_native():
    p = cpu_profile(XEON, XEON_FLAGS, {"fp32": 100.0, "bf16": 20.0, "fp16": 105.0})
    bf16 = p.dtypes["bf16"]
    assert (bf16.native, bf16.flags_native, bf16.emulated) == (False, True, True)
    assert any("bf16" in n and "treated as emulated" in n for n in p.notes)
    assert "0.20x" in dtype_warning(p, "bf16")
    assert "yet it measured at emulated speed" in dtype_warning(p, "bf16")
    assert best_dtype(p) == "fp32"  # fp16's 1.05x is inside the 1.1x margin
    assert "int8" not in p.dtypes  # not measured, not reported


@pytest.mark.parametrize(
    ("bf16", "fp16", "best"),
    [(105.0, 100.0, "fp32"), (115.0, 100.0, "bf16"), (115.0, 130.0, "fp16"), (None, 90.0, "fp32")],
)
def test_best_dtype_needs_a_margin_over_fp32(bf16, fp16, best):
    measured = {"fp32": 100.0, "fp16": fp16, "bf16": bf16 if bf16 else "no kernel: none"}
    assert best_dtype(cpu_profile(XEON, XEON_FLAGS, measured)) == best


def test_not_native_is_never_best_even_when_it_measured_fast():
    p = cpu_profile(EPYC, EPYC_FLAGS, {"fp32": 100.0, "bf16": 150.0})
    assert best_dtype(p) == "fp32"
    assert "1.50x" in dtype_warning(p, "bf16") and "not native here" in dtype_warning(p, "bf16")
    assert any("kept as not native" in n for n in p.notes)


def test_dtype_warning_names_the_ratio_below_point_nine():
    p = cpu_profile(XEON, XEON_FLAGS, {"fp32": 100.0, "bf16": 80.0, "fp16": 95.0})
    assert dtype_warning(p, "bf16") == (
        f"bf16 runs at 0.80x fp32 on cpu ({XEON}, avx512_bf16/amx_bf16): expect it dearer"
    )
    assert dtype_warning(p, "fp16") is None  # 0.95x, native
    assert dtype_warning(p, "int8") is None  # not in the profile


def test_cuda_classification_by_compute_capability():
    t4, notes = classify_cuda((7, 5), {"fp32": 8000.0, "bf16": 300.0, "fp16": 60000.0})
    assert not t4["bf16"].native and t4["bf16"].reason == "compute capability 7.5 < 8.0"
    assert t4["fp16"].native and t4["fp16"].ratio_vs_fp32 == pytest.approx(7.5)
    p = DeviceProfile(
        device="cuda:0",
        device_label="cuda:0 Tesla T4",
        device_class="cuda:Tesla T4",
        cpu_model="host cpu, not named in GPU warnings",
        compute_capability=(7, 5),
        dtypes=t4,
    )
    assert best_dtype(p) == "fp16"
    assert dtype_warning(p, "bf16") == (
        "bf16 runs at 0.04x fp32 on cuda:0 Tesla T4 (compute capability 7.5 < 8.0): "
        "expect it dearer"
    )
    h200, _ = classify_cuda((9, 0), {"fp32": 50e3, "bf16": 700e3, "fp16": 690e3, "int8": 1.2e6})
    assert all(h200[d].native for d in ("bf16", "fp16", "int8"))
    assert h200["bf16"].reason == "compute capability 9.0 >= 8.0"


# --- reading the hardware -------------------------------------------------------------------


def test_read_cpu_info_x86_arm_and_fallback(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
        "flags\t\t: fpu avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: other\nflags\t: avx512f\n"
    )
    assert read_cpu_info(x86) == ("AMD EPYC 7B13", frozenset({"fpu", "avx", "avx2", "fma"}))
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd asimdhp bf16 i8mm\n")
    model, flags = read_cpu_info(arm)
    assert {"bf16", "i8mm", "asimdhp"} <= flags and model  # model from platform
    graviton = cpu_profile(model, flags, {"fp32": 100.0, "bf16": 250.0, "fp16": 180.0})
    assert graviton.dtypes["bf16"].native and best_dtype(graviton) == "bf16"
    model, flags = read_cpu_info(tmp_path / "absent")
    assert model and flags == frozenset()


class NVMLError(Exception):
    pass


def fake_nvml(*, gpm: bool = True, name: object = b"NVIDIA H200", power_fails: bool = False):
    calls: list[str] = []

    def power(handle):
        if power_fails:
            raise NVMLError("Not Supported")
        return 700_000  # milliwatts

    def by_uuid(uuid):
        if uuid != "GPU-1234":
            raise NVMLError("Not Found")
        return "handle-by-uuid"

    nvml = SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda i: f"handle-{i}",
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetName=lambda h: calls.append(h) or name,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=143_771 * 2**20, used=0, free=0),
        nvmlDeviceGetPowerManagementLimit=power,
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        calls=calls,
    )
    if gpm:
        nvml.nvmlGpmQueryDeviceSupport = lambda h: SimpleNamespace(version=1, isSupportedDevice=1)
    return nvml


def test_read_nvml_parses_a_fake_driver():
    nvml = fake_nvml()
    info = read_nvml(0, nvml)
    assert info.name == "NVIDIA H200"  # bytes decoded
    assert info.total_memory_mib == 143_771
    assert info.power_limit_w == 700.0
    assert info.compute_capability == (9, 0)
    assert info.gpm_supported is True and info.errors == ()
    assert nvml.calls == ["init", "handle-0", "shutdown"]


def test_read_nvml_without_gpm_and_with_a_failing_field():
    nvml = fake_nvml(gpm=False, name="Tesla T4", power_fails=True)
    info = read_nvml(3, nvml, uuid="1234")  # torch's uuid has no "GPU-"; NVML's has
    assert info.name == "Tesla T4" and info.gpm_supported is False
    assert info.power_limit_w is None and info.errors == (
        "nvmlDeviceGetPowerManagementLimit: Not Supported",
    )
    assert nvml.calls == ["init", "handle-by-uuid", "shutdown"]


def test_read_nvml_refuses_when_the_driver_does_not_start():
    nvml = fake_nvml()

    def no_driver():
        raise NVMLError("Driver Not Loaded")

    nvml.nvmlInit = no_driver
    with pytest.raises(ProfileError, match="NVML unavailable: Driver Not Loaded"):
        read_nvml(0, nvml)


# --- measuring ------------------------------------------------------------------------------


def test_measure_profile_on_this_cpu_within_budget():
    started = time.perf_counter()
    p = measure_profile(torch.device("cpu"))
    elapsed = time.perf_counter() - started
    assert elapsed <= 4.0, f"the CPU profile took {elapsed:.2f} s"
    assert p.dtypes["fp32"].gflops > 0 and p.dtypes["fp32"].ratio_vs_fp32 == 1.0
    assert set(p.dtypes) == {"fp32", "bf16", "fp16", "int8"}
    assert p.memory_bandwidth_gbs is None or p.memory_bandwidth_gbs > 0
    assert p.device == "cpu" and p.device_class.startswith(f"cpu:{p.cpu_model}|")
    assert p.threads == torch.get_num_threads() and p.cuda_name is None
    assert p.dtypes["bf16"].flags_native == any(
        f in p.cpu_flags for f in ("avx512_bf16", "amx_bf16", "bf16")
    )
    data = p.as_dict()
    assert set(data) == PROFILE_KEYS and set(data["dtypes"]["bf16"]) == DTYPE_KEYS
    assert DeviceProfile.from_dict(json.loads(json.dumps(data))) == p
    assert best_dtype(p) in ("fp32", "bf16", "fp16")
    # Throughput against the micro-batch's rows, smallest first, for fp32 at least: where it
    # flattens is `max_micro_batch: auto`'s ceiling. On a host loaded past the budget (the CI's
    # 3 test workers on 2 cores) the dtypes' timing can use it all: the curve is then left out,
    # which saturation_rows reports as None and `auto` falls back on.
    if not p.rows_gflops:
        assert saturation_rows(p, "fp32") is None
        return
    rows = [r for r, _g in p.rows_gflops["fp32"]]
    assert rows == sorted(rows) and rows[0] == 64 and rows, p.rows_gflops
    assert p.rows_kn == (256, 768) and saturation_rows(p, "fp32")[0] in rows


def test_an_unmeasurable_dtype_is_recorded_and_a_failing_fp32_refuses(monkeypatch):
    real = prof._gemm_inputs

    def no_int8(name, m, k, n, device):
        if name == "int8":
            raise RuntimeError("_int_mm: no kernel for this build\nsecond line")
        return real(name, m, k, n, device)

    monkeypatch.setattr(prof, "_gemm_inputs", no_int8)
    p = measure_profile("cpu", budget_s=0.3, threads=1)
    assert p.threads == 1
    assert p.dtypes["int8"].error == "no kernel: RuntimeError: _int_mm: no kernel for this build"
    assert p.dtypes["fp32"].gflops > 0
    assert "could not be measured" in dtype_warning(p, "int8")

    monkeypatch.setattr(prof, "_gemm_inputs", lambda *a: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(ProfileError, match="fp32 GEMM failed"):
        measure_profile("cpu", budget_s=0.2)


def test_devices_that_cannot_be_profiled_refuse_clearly():
    with pytest.raises(ProfileError, match="only cpu and cuda"):
        measure_profile("meta")
    with pytest.raises(ProfileError, match="is not a device"):
        measure_profile("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ProfileError, match="no usable CUDA device"):
            measure_profile("cuda:0")


def test_cli_profile_table(capsys):
    assert main(["profile", "--device", "cpu", "--budget", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "best dtype" in out and "fp32" in out and "GFLOP/s" in out
    assert main(["profile", "--device", "mps"]) == 1
    assert "only cpu and cuda" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_profile_json_through_a_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_runtime", "profile", "--device", "cpu", "--json"]
        + ["--budget", "0.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == PROFILE_KEYS | {"best_dtype", "warnings"}
    assert data["best_dtype"] in ("fp32", "bf16", "fp16")
    assert data["dtypes"]["fp32"]["gflops"] > 0 and data["device"] == "cpu"
    assert DeviceProfile.from_dict(data).device_class == data["device_class"]
