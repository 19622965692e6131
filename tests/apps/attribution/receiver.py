"""A real local HTTP webhook receiver (http.server in a thread) that answers as scripted."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[tuple[int, float]] = []  # (status, seconds to wait first); then 200s
        self.lock = threading.Lock()
        self.url = ""

    def answer(self) -> tuple[int, float]:
        with self.lock:
            return self.script.pop(0) if self.script else (200, 0.0)

    def alerts(self, event: str | None = None) -> list[dict]:
        """Requests answered 2xx (what the receiver accepted), optionally of one event type."""
        return [
            r
            for r in self.requests
            if 200 <= r["status"] < 300 and (event is None or r["body"]["event"] == event)
        ]

    def wait_for(self, n: int, timeout_s: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.alerts()) < n:
            time.sleep(0.05)
        return self.alerts()


@contextlib.contextmanager
def webhook_receiver():
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, delay = receiver.answer()
            if delay:
                time.sleep(delay)
            with receiver.lock:
                receiver.requests.append(
                    {
                        "headers": dict(self.headers),
                        "body": body,
                        "status": status,
                        "raw": json.dumps(body, sort_keys=True),
                    }
                )
            try:
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"received" if status < 300 else b"receiver failure")
            except OSError:  # the client gave up waiting (a timeout test)
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_port}/hooks/costlab"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
