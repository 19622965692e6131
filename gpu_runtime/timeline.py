"""Timestamps of compute and copies on one timeline, and the overlap ratio between them.

On CUDA a timestamp is an event recorded on a stream (device time, no host sync);
on CPU it is the wall clock. The trainer and the prefetcher only take stamps; the
telemetry sampler turns them into seconds later, off the hot path.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from typing import Any, NamedTuple

import torch

Stamp = Any  # float (CPU) or torch.cuda.Event (CUDA)


class Clock:
    """Wall clock on CPU; CUDA events measured from an origin event on a device."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin.record(torch.cuda.current_stream(device))
        else:
            self._origin = time.perf_counter()

    def stamp(self, stream: Any = None) -> Stamp:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def seconds(self, stamp: Stamp) -> float | None:
        """Seconds since the origin, or None while a CUDA event has not completed yet."""
        if not self.cuda:
            return stamp - self._origin
        if not stamp.query():
            return None
        return self._origin.elapsed_time(stamp) / 1000.0


class StepWindow(NamedTuple):
    step: int
    compute_start: Stamp
    compute_end: Stamp
    io_start: Stamp  # the copy (CUDA) or host load (CPU) of this step's batch
    io_end: Stamp


def overlap_ratio(
    compute: tuple[float, float], io_intervals: list[tuple[float, float]], io_len: float
) -> float | None:
    """The design document's ratio: |compute ∩ I/O| / max(|compute|, |I/O|).

    ``io_intervals`` are the loads/copies recorded around the step (a prefetcher runs
    them while a step computes); ``io_len`` is the I/O one step needs, the duration of
    its own batch's load.
    """
    start, end = compute
    inter = sum(max(0.0, min(end, e) - max(start, s)) for s, e in io_intervals)
    longer = max(end - start, io_len)
    if longer <= 0:
        return None
    return min(1.0, inter / longer)


class OverlapMeter:
    """Resolves step windows into per-step overlap ratios; called from the sampler thread only.

    At most ``max_steps`` of the steps finished since the last call are measured (the
    newest), so the cost per sample is bounded however fast steps are. Loads come from
    one producer in order, so their intervals are sorted and disjoint: a bisection finds
    the few that touch a step.
    """

    def __init__(
        self,
        clock: Clock,
        windows: deque[StepWindow],
        io_log: deque[tuple[Stamp, Stamp]],
        max_steps: int = 32,
    ):
        self.clock, self.windows, self.io_log, self.max_steps = clock, windows, io_log, max_steps
        self._next_step = 0

    def collect(self) -> list[float]:
        """Overlap ratios of (up to ``max_steps`` of) the steps finished since the last call."""
        fresh: list[StepWindow] = []
        for w in reversed(self.windows.copy()):  # deque.copy is atomic under the GIL
            if w.step < self._next_step or len(fresh) == self.max_steps:
                break
            fresh.append(w)
        starts, ends = [], []
        for a, b in self.io_log.copy():
            sa, sb = self._resolve(a, b)
            if sa is not None:
                starts.append(sa)
                ends.append(sb)
        ratios = []
        for w in reversed(fresh):
            cs, ce = self._resolve(w.compute_start, w.compute_end)
            ios, ioe = self._resolve(w.io_start, w.io_end)
            if cs is None or ios is None:
                break  # not finished on the device yet: pick it up next time
            first = bisect.bisect_right(ends, cs)
            last = bisect.bisect_left(starts, ce, lo=first)
            ratio = overlap_ratio(
                (cs, ce), list(zip(starts[first:last], ends[first:last], strict=True)), ioe - ios
            )
            if ratio is not None:
                ratios.append(ratio)
            self._next_step = w.step + 1
        return ratios

    def _resolve(self, a: Stamp, b: Stamp) -> tuple[float | None, float | None]:
        sa, sb = self.clock.seconds(a), self.clock.seconds(b)
        return (None, None) if sa is None or sb is None else (sa, sb)
