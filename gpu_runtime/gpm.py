"""Kernel-level counters from NVML GPM (GPU Performance Monitoring, Hopper and later): SM
occupancy, tensor-pipe activity and DRAM bandwidth utilisation, each in % over the interval
between two GPM samples of the device.

None where there is no figure: a device before Hopper, a driver or an nvidia-ml-py without the
GPM API, a metric NVML answers with an error, or a read too soon after the last. Nothing is
guessed.

gpu_runtime/gpm.py and costlab/gpm.py are the same file, kept identical by
tests/gpu_runtime/test_gpm.py: the SDK may not import gpu_runtime (it must not need torch) and
gpu_runtime needs torch alone, so neither can import the other's copy. This one needs neither torch
nor Django: only the `pynvml` module a probe already opened, passed in.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# (the sample's key, the NVML metric id's name). Tensor activity is ANY_TENSOR_UTIL: the share of
# time the SMs' tensor pipes did any tensor work (HMMA, IMMA, DMMA alike), as DCGM's
# DCGM_FI_PROF_PIPE_TENSOR_ACTIVE reports it.
GPM_METRICS = (
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_bw_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
GPM_KEYS = tuple(key for key, _ in GPM_METRICS)
# NVML computes a metric from the counters' change between two samples: closer than this, the
# figure is noise (NVML's documentation asks for about 100 ms).
MIN_INTERVAL_S = 0.1
_API = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmSampleFree",
    "nvmlGpmMetricsGet",
    "c_nvmlGpmMetricsGet_t",
    "NVML_GPM_METRICS_GET_VERSION",
)


@dataclass(frozen=True)
class GpmReading:
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_bw_pct: float | None = None


UNAVAILABLE = GpmReading()


def gpm_value(metric: Any, success: int = 0) -> float | None:
    """One entry of an nvmlGpmMetricsGet answer as a percentage: None when NVML answered that
    metric with an error or a value that is no percentage; clamped to [0, 100] (counter rounding
    reads 100.2 % on a saturated pipe)."""
    if int(getattr(metric, "nvmlReturn", success)) != success:
        return None
    value = float(metric.value)
    if not math.isfinite(value) or value < 0:
        return None
    return min(value, 100.0)


class GpmSampler:
    """GPM on one device: `read()` gives the metrics from the previous read (or from opening) to
    now. Two sample buffers, swapped at each read; `close()` frees them."""

    def __init__(self, nvml: Any, handle: Any, *, clock=time.monotonic):
        self.nvml, self.handle, self._clock = nvml, handle, clock
        self.supported = False
        self.reason = ""
        self._older = self._newer = None
        self._older_at = 0.0
        missing = [name for name in _API if not hasattr(nvml, name)]
        missing += [const for _, const in GPM_METRICS if not hasattr(nvml, const)]
        if missing:
            self.reason = f"this nvidia-ml-py has no GPM API ({missing[0]} missing)"
            return
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
        except nvml.NVMLError as exc:
            self.reason = f"GPM support query failed ({exc})"
            return
        if not getattr(support, "isSupportedDevice", 0):
            self.reason = "the device has no GPM (it is before Hopper, or GPM is off)"
            return
        try:
            self._older = nvml.nvmlGpmSampleAlloc()
            self._newer = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(handle, self._older)
        except nvml.NVMLError as exc:
            self.reason = f"GPM sample failed ({exc})"
            self.close()
            return
        self._older_at = self._clock()
        self._request = nvml.c_nvmlGpmMetricsGet_t()  # ~19 kB of ctypes: built once, reused
        self.supported = True

    def read(self) -> GpmReading:
        if not self.supported:
            return UNAVAILABLE
        now = self._clock()
        if now - self._older_at < MIN_INTERVAL_S:
            return UNAVAILABLE  # keep the older sample: the next read spans the whole interval
        nvml, request = self.nvml, self._request
        try:
            nvml.nvmlGpmSampleGet(self.handle, self._newer)
        except nvml.NVMLError as exc:
            log.debug("GPM sample failed (%s)", exc)
            return UNAVAILABLE
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = self._older, self._newer
        for i, (_, const) in enumerate(GPM_METRICS):
            request.metrics[i].metricId = getattr(nvml, const)
        # The newer sample starts the next interval, whatever this one's answer.
        self._older, self._newer, self._older_at = self._newer, self._older, now
        try:
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            log.debug("GPM metrics failed (%s)", exc)
            return UNAVAILABLE
        success = getattr(nvml, "NVML_SUCCESS", 0)
        return GpmReading(
            **{
                key: gpm_value(request.metrics[i], success)
                for i, (key, _) in enumerate(GPM_METRICS)
            }
        )

    def close(self) -> None:
        for sample in (self._older, self._newer):
            if sample is not None:
                try:
                    self.nvml.nvmlGpmSampleFree(sample)
                except self.nvml.NVMLError:
                    pass
        self._older = self._newer = None
        self.supported = False
