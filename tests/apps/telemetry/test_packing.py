"""The packing codec gives every value back exactly, whatever the column holds."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from apps.telemetry.packing import FIELDS, pack, unpack

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def nvml_like(n: int, *, seed: int = 0, step_s: float = 2.7, rank: int = 0) -> list[dict]:
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
                "rank": rank,
                "device": f"cuda:{rank} NVIDIA H100 80GB HBM3",
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


def ranks_of(per_rank: int, ranks: int = 8) -> list[dict]:
    """A DDP run's minute: each rank's readings, the run's seqs numbered as they arrived."""
    rows = [nvml_like(per_rank, seed=r, rank=r) for r in range(ranks)]
    out = [row for i in range(per_rank) for row in (rs[i] for rs in rows)]
    for seq, row in enumerate(out):
        row["seq"] = seq
    return sorted(out, key=lambda r: (r["rank"], r["seq"]))  # as compaction orders a blob


def test_every_rank_of_a_minute_in_one_blob_costs_fewer_bytes_than_a_blob_a_rank():
    """Eight ranks of 20 samples (a partly filled minute): 16.6 bytes a sample in one blob against
    25.6 in eight; a full minute, 14.7 against 19.1."""
    for per_rank, most in ((20, 17.5), (60, 15.5)):
        rows = ranks_of(per_rank)
        blob = pack(rows)
        assert all(same(a, b) for a, b in zip(rows, unpack(blob), strict=True))
        alone = sum(len(pack([r for r in rows if r["rank"] == k])) for k in range(8))
        assert len(blob) / len(rows) < most < alone / len(rows), (len(blob), alone, per_rank)


# Packed by version 1 (one rank a blob, no rank column): nvml_like(4, seed=7), minus its rank.
V1_BLOB = bytes.fromhex(
    "e001af00dc5d0000813207e2a47ad960d1384d12ac9bf5a41c831ab33d2c45633a53d79333cc09664de950d3"
    "d74af1078da4da5260180d0c096da844889940f50850dd0b30833148d78e366b12e22a24100272d282e46b0d"
    "bf7b88328ca5364b9834fc18a74bec9eb608b8f4a2aca26d1806947be68fdaca1b46328244a65d9bab81e79a"
    "20cb107f1dc6cb379b67c79817409c39763f5ff758b6b5fbaba09eded8a7158926aff337719d56b516e709ac"
    "c6666a6d687adb841b9033aa216730a9bc6dc25be511da70a63887f60f9171eceede11aa85b6fc129b100bc7"
    "93f5d09ff9ff7a00"
)


def test_a_blob_packed_before_ranks_shared_one_still_decodes():
    rows = nvml_like(4, seed=7)
    for row in rows:
        del row["rank"]
        row["device"] = "cuda:0 NVIDIA H100 80GB HBM3"
    assert unpack(V1_BLOB) == rows


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
