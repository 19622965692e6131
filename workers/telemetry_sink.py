"""The worker's telemetry sink: buffer samples, flush them in batches off the training path.

`put` only appends under a lock (the trainer's sampler thread calls it). A flusher thread
sends a batch every <= FLUSH_S seconds (COSTLAB_TELEMETRY_SEND_EVERY_S where set, else 1 s) or
once BATCH samples wait. A failed flush keeps
the same samples (same seqs) and retries with backoff; storage is idempotent by (run, seq),
so a retry of a batch that did land changes nothing. The buffer is bounded: past
MAX_BUFFERED the oldest samples are dropped and counted, and the log says so.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections, connection

from apps.core.exceptions import ApplicationError

logger = logging.getLogger(__name__)


class TelemetrySink:
    def __init__(
        self,
        *,
        run_id: int,
        attempt: int,
        seq_base: int,
        ingest: Callable[..., object],
        seq_stride: int = 1,
        seq_offset: int = 0,
        flush_s: float | None = None,
        batch: int = 500,
        max_buffered: int = 100_000,
    ):
        self.run_id, self.attempt, self.seq_base = run_id, attempt, seq_base
        # A run across nodes: node k of n stores its samples at seq_base + i * n + k (disjoint,
        # interleaved).
        self.seq_stride, self.seq_offset = seq_stride, seq_offset
        if flush_s is None:
            flush_s = settings.COSTLAB_TELEMETRY_SEND_EVERY_S or 1.0
        self.FLUSH_S, self.BATCH, self.MAX_BUFFERED = flush_s, batch, max_buffered
        self._ingest = ingest
        self._buffer: deque[dict] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._abandoned = threading.Event()
        self.dropped = 0
        self.flushed = 0
        self.failures = 0
        self._thread = threading.Thread(
            target=self._loop, name=f"telemetry-sink-{run_id}", daemon=True
        )
        self._thread.start()

    def put(self, sample: dict) -> None:
        """Called by the runtime (any thread). Never blocks on I/O."""
        sample = dict(
            sample, seq=self.seq_base + int(sample["seq"]) * self.seq_stride + self.seq_offset
        )
        with self._lock:
            self._buffer.append(sample)
            if len(self._buffer) > self.MAX_BUFFERED:
                self._buffer.popleft()
                self.dropped += 1
                if self.dropped in (1, 100) or self.dropped % 10_000 == 0:
                    logger.error(
                        "run %s: telemetry buffer full (%d); dropped %d oldest samples so far",
                        self.run_id,
                        self.MAX_BUFFERED,
                        self.dropped,
                    )
            full = len(self._buffer) >= self.BATCH
        if full:
            self._wake.set()

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush what is left (retrying with backoff until timeout_s: a database blip at the end of
        a run must not lose its last samples), then stop the flusher."""
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self._abandoned.set()
        self._wake.set()
        if self.pending:
            logger.error(
                "run %s: %d telemetry samples could not be stored before close",
                self.run_id,
                self.pending,
            )

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._buffer)

    def _loop(self) -> None:
        backoff = self.FLUSH_S
        try:
            while True:
                self._wake.wait(backoff if self.failures else self.FLUSH_S)
                self._wake.clear()
                closing = self._closing.is_set()
                if self._flush_all():
                    backoff = self.FLUSH_S
                else:
                    backoff = min(backoff * 2, 10.0)
                if self._abandoned.is_set() or (closing and not self.pending):
                    return
        finally:
            connection.close()

    def _flush_all(self) -> bool:
        while True:
            with self._lock:
                batch = [self._buffer[i] for i in range(min(self.BATCH, len(self._buffer)))]
            if not batch:
                return True
            try:
                close_old_connections()
                self._ingest(run_id=self.run_id, samples=batch, attempt=self.attempt)
            except (
                ApplicationError
            ) as exc:  # refused for good (the run moved on): retrying cannot help
                with self._lock:
                    discarded = len(self._buffer)
                    self._buffer.clear()
                self.dropped += discarded
                self._abandoned.set()
                logger.error(
                    "run %s: telemetry refused (%s); discarded %d samples",
                    self.run_id,
                    exc,
                    discarded,
                )
                return True
            except Exception as exc:  # database down, lock timeout...: keep the batch, retry later
                self.failures += 1
                logger.warning(
                    "run %s: telemetry flush failed (%s: %s); keeping %d samples buffered, "
                    "will retry",
                    self.run_id,
                    type(exc).__name__,
                    exc,
                    self.pending,
                )
                connection.close()
                return False
            self.failures = 0
            stored = {s["seq"] for s in batch}
            with self._lock:
                # put() may have dropped from the left meanwhile: remove by seq, not by count.
                while self._buffer and self._buffer[0]["seq"] in stored:
                    self._buffer.popleft()
            self.flushed += len(batch)
