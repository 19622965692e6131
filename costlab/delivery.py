"""Getting samples to the server without ever holding up the training: a bounded buffer in
memory, a spool on disk beyond it, and a sender thread that drains both in batches.

The sampler thread puts; the sender thread takes, posts and acknowledges. A sample leaves the
buffer or the spool only once the server has answered for it, so an outage (the site down, a
gateway answering 502/503/504, throttling) costs nothing but disk: the sender backs off, retries,
and sends the backlog when the site answers again. The server stores a (run, seq) once, so a
batch sent twice (an answer lost on the way back) is harmless.

The spool is a directory of JSON-lines segments (``segment-00000001.jsonl``: one sample a line),
oldest first; a segment is deleted once every sample in it was stored. It lives under
``default_spool_root()`` unless the caller names a directory: COSTLAB_SPOOL_DIR, else the user's
cache folder, never the system temp folder (cleaned at reboot, and shared).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
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


def default_spool_root() -> Path:
    """Where spools go when no directory is given: COSTLAB_SPOOL_DIR, else the user's cache folder
    (``$XDG_CACHE_HOME/costlab/spool``, else ``~/.cache/costlab/spool``; on macOS
    ``~/Library/Caches/costlab/spool``, on Windows ``%LOCALAPPDATA%\\costlab\\spool``)."""
    given = os.environ.get("COSTLAB_SPOOL_DIR", "").strip()
    if given:
        return Path(given).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:  # XDG: a relative XDG_CACHE_HOME is invalid and ignored
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "costlab" / "spool"


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
                root = default_spool_root()
                root.mkdir(parents=True, exist_ok=True)
                self.path = Path(tempfile.mkdtemp(prefix=self._prefix, dir=root))
            else:
                self.path = self._given
                self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def directory(self) -> Path:
        """The spool's directory, made now if no sample made it yet."""
        return self._dir()

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

    def discard(self) -> int:
        """Forget what is not yet stored (nobody will take it); how many samples that was."""
        with self._lock:
            count = len(self._memory) + self.spool.count
            self._memory.clear()
            self.spool.close()
            return count

    def __len__(self) -> int:
        with self._lock:
            return len(self._memory) + self.spool.count


ENDED = re.compile(r"\b(?:is|already) (?:already )?(succeeded|failed|cancelled|lost)\b")


class Refused(Exception):
    """The server answered for good (4xx): resending the same batch cannot help. `code`: the
    error's code in costlab's error body (``run_finished``, ...), where it said one."""

    def __init__(self, status: int, reason: str, code: str = ""):
        super().__init__(f"HTTP {status}: {reason}")
        self.status, self.reason, self.code = status, reason, code

    @property
    def run_ended(self) -> str | None:
        """How the run had already ended ("succeeded", ...; "ended" where not said) when this
        refusal says it had (409: an ended run takes no samples, no second end, no new stream
        under its key), else None."""
        if self.status not in (400, 409):
            return None
        found = ENDED.search(self.reason)
        if found and (self.status == 409 or "already" in self.reason):
            return found.group(1)
        return "ended" if self.code == "run_finished" else None


class Sender:
    """A daemon thread posting the outbox in batches every `every_s` (at once while flushing),
    backing off exponentially (capped at 30 s) while the site cannot take them.

    `post(samples, timeout_s)` stores a batch or raises: Refused for an answer that will not
    change, anything else for a failure worth retrying. `ready()` is called before the first post
    and until it returns True (the run may still have to be created: the SDK creates it here, so
    the training never waits on the site).

    The site is *failing* while its last try failed (`outage_since`) or the run is not created
    yet (`ready()` never said True): the end's `flush` then gives it one more try of at most
    PROBE_S and leaves the rest to the spool.
    """

    MAX_BACKOFF_S = 30.0
    PROBE_S = 1.0  # a flush's try of a failing site: what the end spends on a site that is down

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
        self.refusal: Refused | None = None  # the answer it gave up on
        self.run_ended: str | None = None  # how the run had already ended, where that was why
        self.say_refusal = True  # False while the caller raises a refusal itself (the start)
        self.outage_since: float | None = None
        self.failures = 0  # tries failed in a row (an outage)
        self.failed_tries = 0  # in all
        self.problem = ""  # the last failure's
        self.ready_seen = False  # ready() said True: the run exists
        self._wake = threading.Event()
        self._flush_by: float | None = None
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="costlab-sender", daemon=True)

    def start(self) -> Sender:
        self._thread.start()
        return self

    @property
    def failing(self) -> bool:
        """The last try failed, or none has created the run yet."""
        return self.outage_since is not None or not self.ready_seen

    def flush(self, timeout_s: float, *, patience_s: float | None = None) -> bool:
        """Send everything now; True when the outbox emptied. Gives up at `timeout_s`; with
        `patience_s`, sooner where the site fails: one already failing as the flush begins gets one
        more try (up to PROBE_S), an outage that begins during the flush `patience_s`."""
        start = time.monotonic()
        deadline = self._flush_by = start + timeout_s
        down, failed = self.failing, self.failed_tries
        self._idle.clear()
        self._wake.set()
        while (now := time.monotonic()) < deadline:
            if self.stopped_why is not None or not self._thread.is_alive():
                break
            if patience_s is not None:
                if not self.failing:
                    down = False  # it answered: an outage from now on is a new one
                elif down:
                    if self.failed_tries > failed or now - start >= self.PROBE_S:
                        break
                elif self.outage_since is not None:
                    if now - max(self.outage_since, start) >= patience_s:
                        break
            if self._idle.wait(min(0.05, max(0.0, deadline - now))):
                if not len(self.outbox):
                    return True
                self._idle.clear()
        return not len(self.outbox)

    def stop(self, join_s: float = 2.0) -> None:
        """Stop; wait up to `join_s` for a try under way (a daemon thread: it may go on alone)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=join_s)

    def _timeout(self) -> float:
        if self._flush_by is None:
            return self.request_timeout_s
        timeout = max(0.5, min(self.request_timeout_s, self._flush_by - time.monotonic()))
        return min(timeout, self.PROBE_S) if self.failing else timeout

    def _sleep(self, seconds: float) -> None:
        if self._flush_by is not None:  # flushing: look again soon, the site may be back
            seconds = min(seconds, 2.0, self._flush_by - time.monotonic())
        self._wake.wait(max(0.05, seconds))
        self._wake.clear()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                progressed = self._step()
            except Refused as exc:
                self.stopped_why, self.refusal, self.run_ended = str(exc), exc, exc.run_ended
                if self.say_refusal and self.run_ended is not None:
                    say(f"the run had already ended ({self.run_ended}): it takes no samples: {exc}")
                elif self.say_refusal:
                    say(f"the server refused the run's telemetry ({exc}); what is left is kept")
                self._idle.set()
                return
            except Exception as exc:  # an outage, or a site that cannot answer right now
                self.failures += 1
                self.failed_tries += 1
                self.problem = str(exc) or type(exc).__name__
                if self.outage_since is None:
                    self.outage_since = time.monotonic()
                    if not self._stop.is_set():
                        say(f"cannot deliver telemetry ({exc}); retrying in the background")
                delay = min(self.MAX_BACKOFF_S, 0.5 * 2 ** (self.failures - 1))
                self._idle.set()
                self._sleep(delay * (0.5 + random.random()))
                continue
            if self.failures:
                say(
                    "telemetry delivered again after "
                    f"{time.monotonic() - (self.outage_since or time.monotonic()):.0f} s"
                )
                self.failures, self.outage_since = 0, None
            if not progressed:
                self._idle.set()
                self._sleep(0.05 if self._flush_by is not None else self.every_s)

    def _step(self) -> bool:
        """Post one batch; False when there was nothing to post."""
        if not self.ready(self._timeout()):
            raise ConnectionError("the run is not created yet")
        self.ready_seen = True
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
