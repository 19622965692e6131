"""Points of a sweep's space that the queue's device profiles show to be dominated, left out
before the search spends a probe on them.

On a CPU that emulates bf16 (AVX2 only) a bf16 step is 30-60x slower than fp32 at the same
memory: every bf16 point is dominated by its fp32 twin, so probing one buys nothing. And
`auto` resolves to one of the named dtypes on the queue's devices: where that dtype is in the
space too, the auto point is the same training as its twin. Pruned only when every device the
queue has seen agrees; a key always keeps at least one value. Each pruned value is recorded
with its reason (Sweep.pruned).
"""

from __future__ import annotations

from typing import Any

DTYPE_KEY = "precision.compute_dtype"


def dominated_values(*, expanded: dict[str, list[Any]], queue: str) -> list[dict[str, Any]]:
    """[{key, value, reason}] of the values of `expanded` the queue's devices show dominated."""
    from apps.devices.selectors import queue_measurements
    from gpu_runtime.profile import DeviceProfile, best_dtype, dtype_warning

    values = expanded.get(DTYPE_KEY)
    if not values or len(values) < 2:
        return []
    profiles = [DeviceProfile.from_dict(m.profile) for m in queue_measurements(queue=queue)]
    if not profiles:
        return []
    pruned: list[dict[str, Any]] = []
    for dtype in values:
        if dtype in ("fp32", "auto") or "fp32" not in values:
            continue
        said = [dtype_warning(p, dtype) for p in profiles]
        if all(said):
            pruned.append(
                {
                    "key": DTYPE_KEY,
                    "value": dtype,
                    "reason": f"dominated by fp32 on the {queue} queue's devices: {said[0]}",
                }
            )
    if "auto" in values:
        resolved = {best_dtype(p) for p in profiles}
        [twin] = resolved if len(resolved) == 1 else [None]
        if twin in values:
            pruned.append(
                {
                    "key": DTYPE_KEY,
                    "value": "auto",
                    "reason": f"auto resolves to {twin} on every device of the {queue} queue, "
                    f"which the space holds already",
                }
            )
    kept = [v for v in values if v not in {p["value"] for p in pruned}]
    return pruned if kept else pruned[:-1]


def space_pruned(expanded: dict[str, list[Any]], pruned: list[dict[str, Any]]) -> dict:
    """The expanded space without its pruned values."""
    gone: dict[str, set] = {}
    for p in pruned or []:
        gone.setdefault(p["key"], set()).add(
            p["value"] if not isinstance(p["value"], list) else tuple(p["value"])
        )
    return {k: [v for v in vs if v not in gone.get(k, set())] for k, vs in expanded.items()}
