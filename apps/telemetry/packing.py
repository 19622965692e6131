"""A lossless codec for the samples of one run, attempt and minute, every rank's: what compaction
stores in a PackedMinute (apps.telemetry.compaction) in place of about sixty rows a rank.

Column by column, each reading is encoded the way such a reading compresses best:

- a numeric column is tried as integers at a decimal scale (NVML's util in %, power in mW, energy
  in mJ, timestamps in microseconds, counters): the smallest scale 10**k (k <= 6) at which every
  value comes back bit for bit. Its integers are sent as themselves, as first differences, or as
  second differences (a counter, a clock), whichever is smallest, less their median, zigzagged,
  in the narrowest width that holds them, byte-shuffled;
- any other float (a loss) as the XOR of each value's bits with the one before (0 when it
  repeats), byte-shuffled;
- nulls as a bitmap, text as its distinct values and an index, booleans as bits.

The columns are then compressed together with LZMA (raw LZMA2). Decoding gives back every value
exactly: a bill recomputed from packed samples equals the bill from the rows they were.

Version 2 packs the rank as a column, so one blob holds every rank of a minute: a DDP run's ranks
report alike (the same steps and tokens, similar power), and the row's fixed cost on disk (its
tuple and index entries) is paid once a minute, not once a rank and minute. On
full minutes of eight NVML-like ranks: 14.7 bytes a sample against 19.1 one rank a blob; on 20
samples a rank, 16.6 against 25.6 (tests/apps/telemetry/test_packing.py). Version 1 blobs (one
rank's, no rank column: the PackedMinute's rank is theirs) still decode.
"""

from __future__ import annotations

import lzma
import struct
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from apps.telemetry.ingest import COLUMNS

VERSION = 2
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A 64 KiB dictionary: a minute's blob is about 1 KiB, and preset 9's 64 MiB one costs 20 times the
# time for the same bytes (on AMD EPYC, 2 cores: 37 against 690 us a sample).
_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": 1 << 16}]
TEXT = {"device"}
_INTS = {"seq", "step", "rank", "tokens", "micro_batch"}
BOOL = {"estimated"}
# The packed columns, in blob order: every stored column but the row's constants (run, attempt),
# with the timestamp as microseconds since the epoch. Version 1 had no rank.
FIELDS = COLUMNS
_FIELDS_OF = {1: tuple(c for c in COLUMNS if c != "rank"), 2: FIELDS}
_WIDTHS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
ALL_NULL, NO_NULL, SOME_NULL = 0, 1, 2
FLOAT_XOR, RAW_INT = 255, 254


def _us(ts: datetime) -> int:
    return (ts - EPOCH) // timedelta(microseconds=1)


def _shuffled(values: np.ndarray, width: int) -> bytes:
    """Byte i of every value, then byte i+1 ...: runs of equal high bytes compress."""
    return values.astype(_WIDTHS[width]).view(np.uint8).reshape(-1, width).T.tobytes()


def _unshuffled(raw: memoryview, n: int, width: int) -> np.ndarray:
    planes = np.frombuffer(raw, dtype=np.uint8, count=n * width).reshape(width, n)
    return planes.T.copy().view(_WIDTHS[width]).reshape(n)


def _encode_numbers(x: np.ndarray, out: bytearray) -> None:
    """x: float64, or int64 for an integer column (encoded at scale 1, never through a float)."""
    if x.dtype == np.int64:
        if len(x) and int(np.abs(x).max()) >= 2**60:  # past what differences and zigzag hold
            out.append(RAW_INT)
            out += _shuffled(x.view(np.uint64), 8)
            return
        _encode_ints(x, 0, out)
        return
    for k in range(7):
        scale = 10.0**k
        ints = np.round(x * scale)
        if np.all(np.abs(ints) < 2**52) and np.array_equal(ints / scale, x):
            break
    else:
        out.append(FLOAT_XOR)
        bits = x.view(np.uint64)
        out += _shuffled(np.concatenate([bits[:1], bits[1:] ^ bits[:-1]]), 8)
        return
    _encode_ints(ints.astype(np.int64), k, out)


def _encode_ints(ints: np.ndarray, k: int, out: bytearray) -> None:
    best = None
    for order in range(3):
        d = ints.copy()
        for _ in range(order):
            d[1:] = np.diff(d)
        base = int(np.median(d[order:])) if len(d) > order else 0
        d[order:] -= base
        z = ((d << 1) ^ (d >> 63)).astype(np.uint64)
        cost = int(np.sum(np.log2(z.astype(np.float64) + 1)))
        if best is None or cost < best[0]:
            best = (cost, order, base, z)
    _, order, base, z = best
    top = int(z.max())
    width = 1 if top < 2**8 else 2 if top < 2**16 else 4 if top < 2**32 else 8
    out += struct.pack("<BBBq", k, order, width, base)
    out += _shuffled(z, width)


def _decode_numbers(raw: memoryview, pos: int, n: int) -> tuple[np.ndarray, int]:
    k = raw[pos]
    if k == FLOAT_XOR:
        d = _unshuffled(raw[pos + 1 :], n, 8)
        return np.bitwise_xor.accumulate(d).view(np.float64), pos + 1 + 8 * n
    if k == RAW_INT:
        return _unshuffled(raw[pos + 1 :], n, 8).view(np.int64), pos + 1 + 8 * n
    _, order, width, base = struct.unpack_from("<BBBq", raw, pos)
    pos += 11
    z = _unshuffled(raw[pos:], n, width).astype(np.uint64)
    d = ((z >> np.uint64(1)).astype(np.int64)) ^ -((z & np.uint64(1)).astype(np.int64))
    d[order:] += base
    for _ in range(order):
        d = np.cumsum(d)
    return (d if k == 0 else d.astype(np.float64) / 10.0**k), pos + width * n


def pack(rows: Sequence[dict]) -> bytes:
    """The rows (dicts with FIELDS; `ts` a datetime) as one blob, in their order (each rank's
    together, in seq order, compresses best)."""
    n = len(rows)
    out = bytearray(struct.pack("<BI", VERSION, n))
    for name in FIELDS:
        values = [r[name] for r in rows]
        if name == "ts":
            values = [_us(v) for v in values]
        if name in TEXT:
            distinct = list(dict.fromkeys(values))
            text = "\x00".join(distinct).encode()
            out += struct.pack("<HI", len(distinct), len(text)) + text
            where = {v: i for i, v in enumerate(distinct)}
            _encode_numbers(np.array([where[v] for v in values], dtype=np.int64), out)
            continue
        if name in BOOL:
            out += np.packbits(np.array(values, dtype=bool)).tobytes()
            continue
        nulls = np.array([v is None for v in values])
        if nulls.all():
            out.append(ALL_NULL)
            continue
        if nulls.any():
            out.append(SOME_NULL)
            out += np.packbits(nulls).tobytes()
        else:
            out.append(NO_NULL)
        kind = np.int64 if name in _INTS or name == "ts" else np.float64
        _encode_numbers(np.array([v for v in values if v is not None], dtype=kind), out)
    return lzma.compress(bytes(out), format=lzma.FORMAT_RAW, filters=_FILTERS)


def unpack(blob: bytes) -> list[dict]:
    """The rows back, every value as it was stored (ints as int, floats as float); a version 1
    blob's rows have no "rank"."""
    raw = memoryview(lzma.decompress(blob, format=lzma.FORMAT_RAW, filters=_FILTERS))
    version, n = struct.unpack_from("<BI", raw, 0)
    if version not in _FIELDS_OF:
        raise ValueError(f"packed samples: version {version} is not one of {sorted(_FIELDS_OF)}")
    fields = _FIELDS_OF[version]
    pos, columns = 5, {}
    for name in fields:
        if name in TEXT:
            count, size = struct.unpack_from("<HI", raw, pos)
            pos += 6
            distinct = bytes(raw[pos : pos + size]).decode().split("\x00")[:count] or [""]
            pos += size
            index, pos = _decode_numbers(raw, pos, n)
            columns[name] = [distinct[int(i)] for i in index]
            continue
        if name in BOOL:
            size = (n + 7) // 8
            bits = np.unpackbits(np.frombuffer(raw, np.uint8, size, pos))[:n]
            columns[name] = [bool(b) for b in bits]
            pos += size
            continue
        tag = raw[pos]
        pos += 1
        if tag == ALL_NULL:
            columns[name] = [None] * n
            continue
        nulls = np.zeros(n, dtype=bool)
        if tag == SOME_NULL:
            size = (n + 7) // 8
            nulls = np.unpackbits(np.frombuffer(raw, np.uint8, size, pos))[:n].astype(bool)
            pos += size
        present, pos = _decode_numbers(raw, pos, int((~nulls).sum()))
        cast = int if name in _INTS or name == "ts" else float
        it = iter(present.tolist())
        columns[name] = [None if null else cast(next(it)) for null in nulls]
    columns["ts"] = [EPOCH + timedelta(microseconds=us) for us in columns["ts"]]
    return [{name: columns[name][i] for name in fields} for i in range(n)]
