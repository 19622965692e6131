"""Getting samples to the server without ever holding up the training: a bounded buffer in
memory, a spool on disk beyond it, and a sender thread that drains both in batches.

The sampler thread puts; the sender thread takes, posts and acknowledges. A sample leaves the
buffer or the spool only once the server has answered for it, so an outage (the site down, a
gateway answering 502/503/504, throttling) costs nothing but disk: the sender backs off, retries,
and sends the backlog when the site answers again. The server stores a (run, seq) once, so a
batch sent twice (an answer lost on the way back) is harmless.

The spool is a directory of JSON-lines segments (``segment-00000001.jsonl``: one sample a line),
oldest first; a segment is deleted once every sample in it was stored.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SEGMENT_LINES = 5_000


def say(message: str) -> None:
    print(f"costlab: {message}", file=sys.stderr, flush=True)


class Spool:
    """Samples on disk, oldest segment first. Not thread-safe: the Outbox's lock guards it."""

    def __init__(self, directory: str | os.PathLike[str] | None, *, prefix: str = "costlab-"):
        self._given = None if directory is None else Path(directory)
        self._prefix = prefix
        self.path: Path | None = None  # created on the first sample spooled
        self._write_index, self._write_lines, self._writer = 0, 0, None
        self._read_index, self._read_offset = 1, 0
        self.count = 0  # samples on disk, not yet stored by the server

    @classmethod
    def reopen(cls, directory: str | os.PathLike[str]) -> Spool:
        """A spool a process left behind, to be sent (its segments in order)."""
        spool = cls(directory)
        spool.path = Path(directory)
        indices = sorted(int(p.stem.split("-")[1]) for p in spool.path.glob("segment-*.jsonl"))
        if indices:
            spool._read_index, spool._write_index = indices[0], indices[-1]
            spool._write_lines = SEGMENT_LINES  # a new sample would start a segment of its own
            for index in indices:
                with spool._segment(index).open("rb") as fh:
                    spool.count += sum(1 for line in fh if line.endswith(b"\n"))
        return spool

    def _dir(self) -> Path:
        if self.path is None:
            if self._given is None:
                self.path = Path(tempfile.mkdtemp(prefix=self._prefix))
            else:
                self.path = self._given
                self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def _segment(self, index: int) -> Path:
        return self._dir() / f"segment-{index:08d}.jsonl"

    def append(self, sample: dict[str, Any]) -> None:
        if self._writer is None or self._write_lines >= SEGMENT_LINES:
            if self._writer is not None:
                self._writer.close()
            self._write_index += 1
            self._write_lines = 0
            self._writer = self._segment(self._write_index).open("a", encoding="utf-8")
        self._writer.write(json.dumps(sample, separators=(",", ":")) + "\n")
        self._writer.flush()  # in the OS's hands: a crash of this process loses nothing
        self._write_lines += 1
        self.count += 1

    def peek(self, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` of the oldest samples, from one segment, left in place."""
        if not self.count or self._read_index > self._write_index:
            return []
        out = []
        with self._segment(self._read_index).open("rb") as fh:
            fh.seek(self._read_offset)
            for line in fh:
                if not line.endswith(b"\n") or len(out) >= limit:
                    break
                out.append(json.loads(line))
        return out

    def ack(self, samples: list[dict[str, Any]]) -> None:
        """Drop the samples `peek` returned: the server has them."""
        path = self._segment(self._read_index)
        with path.open("rb") as fh:
            fh.seek(self._read_offset)
            for _ in samples:
                self._read_offset += len(fh.readline())
        self.count -= len(samples)
        if self._read_offset >= path.stat().st_size and (
            self._read_index < self._write_index or self._write_lines >= SEGMENT_LINES
        ):
            if self._read_index == self._write_index and self._writer is not None:
                self._writer.close()
                self._writer = None
            path.unlink()
            self._read_index, self._read_offset = self._read_index + 1, 0
        elif self.count == 0 and self._read_index == self._write_index:
            # Everything stored: start the next sample on a fresh segment, drop this one.
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            path.unlink()
            self._read_index, self._read_offset = self._write_index + 1, 0

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class Outbox:
    """What is not yet stored: up to `capacity` samples in memory, the rest spooled."""

    def __init__(self, *, capacity: int, spool: Spool):
        self.capacity, self.spool = capacity, spool
        self._memory: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self.spooled_total = 0

    def put(self, sample: dict[str, Any]) -> None:
        with self._lock:
            if len(self._memory) < self.capacity:
                self._memory.append(sample)
                return
            try:
                self.spool.append(sample)
                self.spooled_total += 1
            except OSError as exc:  # a full or unwritable disk: keep it in memory, say so once
                if len(self._memory) == self.capacity:
                    say(f"cannot spool to {self.spool.path}: {exc}; keeping samples in memory")
                self._memory.append(sample)

    def peek(self, limit: int) -> tuple[list[dict[str, Any]], str]:
        """The oldest samples, from the spool first (they waited longest), and where they are."""
        with self._lock:
            if self.spool.count:
                return self.spool.peek(limit), "spool"
            return [self._memory[i] for i in range(min(limit, len(self._memory)))], "memory"

    def ack(self, samples: list[dict[str, Any]], where: str) -> None:
        with self._lock:
            if where == "spool":
                self.spool.ack(samples)
            else:
                for _ in range(min(len(samples), len(self._memory))):
                    self._memory.popleft()

    def spill(self) -> None:
        """Move what is in memory to the spool (at the end: what was not delivered survives)."""
        with self._lock:
            while self._memory:
                self.spool.append(self._memory.popleft())
            self.spool.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._memory) + self.spool.count


class Refused(Exception):
    """The server answered for good (4xx): resending the same batch cannot help."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status}: {reason}")
        self.status, self.reason = status, reason


class Sender:
    """A daemon thread posting the outbox in batches every `every_s` (at once while flushing),
    backing off exponentially (capped at 30 s) while the site cannot take them.

    `post(samples, timeout_s)` stores a batch or raises: Refused for an answer that will not
    change, anything else for a failure worth retrying. `ready()` is called before the first post
    and until it returns True (the run may still have to be created, after an outage at start).
    """

    MAX_BACKOFF_S = 30.0

    def __init__(
        self,
        *,
        outbox: Outbox,
        post: Callable[[list[dict[str, Any]], float], dict | None],
        ready: Callable[[float], bool] = lambda timeout_s: True,
        every_s: float = 2.0,
        batch_max: int = 1000,
        request_timeout_s: float = 10.0,
    ):
        self.outbox, self.post, self.ready = outbox, post, ready
        self.every_s, self.batch_max, self.request_timeout_s = every_s, batch_max, request_timeout_s
        self.sent = 0
        self.refused: list[str] = []  # why the server refused samples or batches, first few
        self.refused_samples = 0
        self.stopped_why: str | None = None  # the sender gave up: kept in the spool
        self.outage_since: float | None = None
        self._wake = threading.Event()
        self._flush_by: float | None = None
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="costlab-sender", daemon=True)

    def start(self) -> Sender:
        self._thread.start()
        return self

    def flush(self, timeout_s: float) -> bool:
        """Send everything now; True when the outbox emptied within `timeout_s`."""
        self._flush_by = time.monotonic() + timeout_s
        self._idle.clear()
        self._wake.set()
        deadline = self._flush_by
        while time.monotonic() < deadline:
            if self.stopped_why is not None or not self._thread.is_alive():
                break
            if self._idle.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
                if not len(self.outbox):
                    return True
                self._idle.clear()
        return not len(self.outbox)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2.0)

    def _timeout(self) -> float:
        if self._flush_by is None:
            return self.request_timeout_s
        return max(0.5, min(self.request_timeout_s, self._flush_by - time.monotonic()))

    def _sleep(self, seconds: float) -> None:
        if self._flush_by is not None:  # flushing: look again soon, the site may be back
            seconds = min(seconds, 2.0, self._flush_by - time.monotonic())
        self._wake.wait(max(0.05, seconds))
        self._wake.clear()

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                progressed = self._step()
            except Refused as exc:
                self.stopped_why = str(exc)
                say(f"the server refused the run's telemetry ({exc}); what is left stays spooled")
                self._idle.set()
                return
            except Exception as exc:  # an outage, or a site that cannot answer right now
                failures += 1
                if self.outage_since is None:
                    self.outage_since = time.monotonic()
                    say(f"cannot deliver telemetry ({exc}); retrying in the background")
                delay = min(self.MAX_BACKOFF_S, 0.5 * 2 ** (failures - 1)) * (0.5 + random.random())
                self._idle.set()
                self._sleep(delay)
                continue
            if failures:
                say(
                    "telemetry delivered again after "
                    f"{time.monotonic() - (self.outage_since or time.monotonic()):.0f} s"
                )
                failures, self.outage_since = 0, None
            if not progressed:
                self._idle.set()
                self._sleep(0.05 if self._flush_by is not None else self.every_s)

    def _step(self) -> bool:
        """Post one batch; False when there was nothing to post."""
        if not self.ready(self._timeout()):
            raise ConnectionError("the run is not created yet")
        batch, where = self.outbox.peek(self.batch_max)
        if not batch:
            return False
        try:
            answer = self.post(batch, self._timeout())
        except Refused as exc:
            if exc.status == 413 and len(batch) > 1:  # too large a body: smaller batches
                self.batch_max = max(1, len(batch) // 2)
                return True
            if exc.status in (400, 422):  # this batch is wrong, not the run: drop it, go on
                self._note(f"a batch of {len(batch)} samples was refused: {exc.reason}")
                self.refused_samples += len(batch)
                self.outbox.ack(batch, where)
                return True
            raise
        refused = (answer or {}).get("refused") or []
        if refused:
            self.refused_samples += len(refused)
            self._note(f"seq {refused[0].get('seq')}: {refused[0].get('reason')}")
        self.sent += len(batch) - len(refused)
        self.outbox.ack(batch, where)
        return True

    def _note(self, why: str) -> None:
        if len(self.refused) < 5:
            self.refused.append(why)
            say(f"the server refused samples: {why}")
