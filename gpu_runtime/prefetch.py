"""Batches loaded ahead on a background thread and copied to the device on a side stream.

On CUDA the host batch is staged in pinned memory and copied with ``non_blocking``
on a dedicated stream; an event recorded after the copy is what the compute stream
waits on, so compute never waits for more than its own batch. On CPU the thread
only builds the host batch ahead of time.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from gpu_runtime.data import StepBatches
from gpu_runtime.timeline import Clock, Stamp


@dataclass
class DeviceBatch:
    step: int
    tokens: torch.Tensor  # (global_batch, seq_len + 1) on the device
    io_start: Stamp
    io_end: Stamp
    side_stream: bool = False


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetcher:
    """Yields the batch of each step in order; ``depth`` batches ahead (0: inline, no thread)."""

    def __init__(
        self,
        batches: StepBatches,
        *,
        start_step: int,
        end_step: int,
        device: torch.device,
        depth: int,
        pin_memory: bool,
        clock: Clock,
        io_log: deque[tuple[Stamp, Stamp]],
    ):
        self.batches, self.device, self.clock, self.io_log = batches, device, clock, io_log
        self.pin = pin_memory and device.type == "cuda"
        self._next = start_step
        self._end = end_step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._copy_stream = None
        if depth > 0:
            if device.type == "cuda":
                self._copy_stream = torch.cuda.Stream(device)
            self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(
                target=self._run, name="gpu_runtime-prefetch", daemon=True
            )
            self._thread.start()

    def _produce(self, step: int, stream: Any) -> DeviceBatch:
        if self.device.type != "cuda":
            start = self.clock.stamp()
            host = self.batches.batch(step)
            end = self.clock.stamp()
            self.io_log.append((start, end))
            return DeviceBatch(step, host, start, end)
        host = self.batches.batch(step)
        if self.pin:
            host = host.pin_memory()
        stream = stream or torch.cuda.current_stream(self.device)
        with torch.cuda.stream(stream):
            start = self.clock.stamp(stream)
            tokens = host.to(self.device, non_blocking=self.pin)
            end = self.clock.stamp(stream)
        self.io_log.append((start, end))
        return DeviceBatch(step, tokens, start, end, side_stream=stream is self._copy_stream)

    def _put(self, item: Any) -> bool:
        """Queue an item unless asked to stop; False when stopping."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            for step in range(self._next, self._end):
                if not self._put(self._produce(step, self._copy_stream)):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            self._put(_Failed(exc))

    def next(self) -> DeviceBatch:
        """The next step's batch, ready to use on the current stream."""
        if self._next >= self._end:
            raise StopIteration
        if self._thread is None:
            batch = self._produce(self._next, None)
        else:
            item = self._queue.get()
            if isinstance(item, _Failed):
                raise item.exc
            batch = item
        self._next += 1
        if batch.side_stream:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(batch.io_end)
            batch.tokens.record_stream(compute)
        return batch

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            while True:  # unblock a producer waiting on a full queue
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self._thread.join(timeout=5.0)
