"""The packing codec gives every value back exactly, whatever the column holds."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from apps.telemetry.packing import FIELDS, pack, unpack

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def nvml_like(n: int, *, seed: int = 0, step_s: float = 2.7) -> list[dict]:
    """A GPU's minute as NVML and a trainer report it: integer %, mW power, mJ energy, MiB,
    microsecond timestamps with jitter, a loss that changes as steps end."""
    rnd = random.Random(seed)
    rows, t, energy, tokens, step, loss, last = [], T0, 0.0, 0, 0, 4.0, T0
    for seq in range(n):
        t += timedelta(microseconds=1_000_000 + rnd.randint(-2000, 2000))
        power = round(rnd.gauss(620, 25), 3)
        energy = round(energy + power, 3)
        if (t - last).total_seconds() >= step_s:
            step, tokens, last = step + 1, tokens + 32768, t
            loss = loss * 0.999 + rnd.uniform(-0.01, 0.01)
        rows.append(
            {
                "seq": seq,
                "ts": t,
                "step": step,
                "device": "cuda:0 NVIDIA H100 80GB HBM3",
                "util_pct": float(rnd.choice([96, 97, 98, 99, 100])),
                "mem_used_mb": 61234.0,
                "mem_total_mb": 81559.0,
                "power_w": power,
                "energy_j": energy,
                "step_time_s": round(step_s + rnd.uniform(-0.01, 0.01), 6),
                "tokens": tokens,
                "tokens_per_s": None,
                "micro_batch": 8,
                "loss": loss,
                "overlap_ratio": None,
                "mfu": None,
                "sm_clock_mhz": float(rnd.choice([1980, 1965])),
                "temperature_c": float(rnd.choice([61, 62, 63])),
                "sm_occupancy_pct": round(rnd.uniform(40, 60), 1),
                "tensor_active_pct": round(rnd.uniform(30, 50), 1),
                "dram_bw_pct": round(rnd.uniform(20, 40), 1),
                "estimated": False,
            }
        )
    return rows


def same(a: dict, b: dict) -> bool:
    return all(a[f] == b[f] and type(a[f]) is type(b[f]) for f in FIELDS)


def test_a_minute_of_nvml_readings_comes_back_exactly_in_under_20_bytes_a_sample():
    rows = nvml_like(3600)
    sizes = []
    for i in range(0, len(rows), 60):
        minute = rows[i : i + 60]
        blob = pack(minute)
        sizes.append(len(blob))
        assert all(same(a, b) for a, b in zip(minute, unpack(blob), strict=True))
    assert sum(sizes) / len(rows) < 20


def test_awkward_columns_come_back_exactly():
    rnd = random.Random(3)
    rows = nvml_like(61, seed=3)
    for i, row in enumerate(rows):
        row["tokens"] = 2**62 - 61 + i if i % 2 else 0  # counters at the schema's bound
        row["loss"] = None if i % 7 == 0 else rnd.uniform(-1e30, 1e30)  # nulls among floats
        row["power_w"] = rnd.random() * 1e7  # floats at no decimal scale
        row["device"] = ["cpu", "cuda:1 X", ""][i % 3]  # text that changes
        row["estimated"] = i % 5 == 0
        row["mfu"] = 0.0 if i % 2 else -0.0 + 1e-300
        row["step"] = 0
    back = unpack(pack(rows))
    assert all(same(a, b) for a, b in zip(rows, back, strict=True))
    assert unpack(pack(rows[:1]))[0] == {f: rows[0][f] for f in FIELDS}
