"""Reads of devices: what each host's devices are, and what a strategy's dtype costs on the
devices a queue has seen."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from apps.devices.models import Device, DeviceMeasurement


def device_list() -> QuerySet[Device]:
    return Device.objects.select_related("latest").order_by("host", "label")


def device_pages(devices) -> list:
    """Devices with what their page shows: the class in words, and one row per dtype."""
    out = []
    for d in devices:
        d.class_label = device_class_label(d.device_class)
        profile = d.latest.profile if d.latest else {}
        d.dtypes = [{"dtype": name, **row} for name, row in (profile.get("dtypes") or {}).items()]
        out.append(d)
    return out


def device_measurement_latest(*, host: str, label: str) -> DeviceMeasurement | None:
    return (
        DeviceMeasurement.objects.filter(device__host=host, device__label=label)
        .order_by("-measured_at", "-pk")
        .first()
    )


def queue_measurements(*, queue: str) -> list[DeviceMeasurement]:
    """The latest measurement of every device whose worker consumes `queue`."""
    devices = Device.objects.filter(latest__isnull=False).select_related("latest")
    return [d.latest for d in devices if queue in (d.queues or [])]


def device_class_label(device_class: str) -> str:
    """A device class in words: "Intel Xeon ... (amx_bf16, avx512_bf16)" or "NVIDIA H200"."""
    if not device_class:
        return "unknown device"
    kind, _, rest = device_class.partition(":")
    if kind == "cuda":
        return rest
    model, _, flags = rest.partition("|")
    return f"{model} ({flags.replace(',', ', ')})" if flags else model


@dataclass(frozen=True)
class StrategyWarning:
    key: str
    message: str
    ratio: float | None  # the dtype's measured throughput over fp32, at its best across devices
    devices: int  # how many of the queue's devices it was measured on

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "message": self.message,
            "ratio": self.ratio,
            "devices": self.devices,
        }


DTYPE_KEYS = ("precision.compute_dtype", "precision.storage_dtype")


def strategy_device_findings(*, config, queue: str) -> tuple[list[StrategyWarning], list[dict]]:
    """(warnings, refusals) for a parsed strategy on the devices `queue` has seen.

    A warning when a dtype the strategy names is emulated or slower than fp32 on every such
    device (it may still be worth measuring: users decide); a refusal ({key, message}) when
    none of them can run it at all. Nothing when the queue has seen no device yet."""
    from gpu_runtime.profile import DeviceProfile, dtype_warning

    profiles = [DeviceProfile.from_dict(m.profile) for m in queue_measurements(queue=queue)]
    if not profiles:
        return [], []
    warnings, refusals = [], []
    named = {
        "precision.compute_dtype": config.precision.compute_dtype,
        "precision.storage_dtype": config.precision.storage_dtype,
    }
    for key, dtype in named.items():
        if dtype in ("fp32", "auto") or (
            key == "precision.storage_dtype" and dtype == named["precision.compute_dtype"]
        ):
            continue
        results = [p.dtypes.get(dtype) for p in profiles]
        if all(r is not None and r.error and r.gflops is None for r in results):
            refusals.append(
                {
                    "key": key,
                    "message": (
                        f"{dtype} cannot run on any device of the {queue} queue: "
                        + "; ".join(
                            sorted(
                                {
                                    f"{p.device_label}: {r.error}"
                                    for p, r in zip(profiles, results, strict=True)
                                }
                            )
                        )
                    ),
                }
            )
            continue
        said = [dtype_warning(p, dtype) for p in profiles]
        if all(said):
            ratios = [r.ratio_vs_fp32 for r in results if r is not None and r.ratio_vs_fp32]
            best = max(ratios) if ratios else None
            text = said[0] if len(set(said)) == 1 else min(said, key=len)
            where = f"the {queue} queue's devices" if len(profiles) > 1 else f"the {queue} queue"
            warnings.append(
                StrategyWarning(
                    key=key,
                    message=f"{key}: {text} (on {where}, {len(profiles)} measured)",
                    ratio=best,
                    devices=len(profiles),
                )
            )
    return warnings, refusals
