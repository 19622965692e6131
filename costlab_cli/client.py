"""A small client of costlab's REST API v1: bearer token, retries on transient failures,
one error type."""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

import httpx

from costlab_cli import __version__

RETRY_STATUSES = {429, 502, 503, 504}


class CliError(Exception):
    """Anything that ends a command with exit status 2; the message is the one-line reason.
    From an HTTP answer: `status` its code and `reason` the server's message alone."""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.status = status
        self.reason = message if reason is None else reason


class Api:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        attempts: int = 4,
        retry_for_s: float = 0.0,
        transport: httpx.BaseTransport | None = None,
    ):
        url = (url or os.environ.get("COSTLAB_URL", "")).strip()
        token = (token or os.environ.get("COSTLAB_TOKEN", "")).strip()
        if not url:
            raise CliError("COSTLAB_URL is not set (e.g. https://costlab.example.com)")
        if not token:
            raise CliError(
                "COSTLAB_TOKEN is not set "
                "(mint one: manage.py api_token_create --tenant SLUG --name ci)"
            )
        if not url.startswith(("http://", "https://")):
            raise CliError(f"COSTLAB_URL must start with http:// or https://, got {url!r}")
        self.attempts = attempts
        self.retry_for_s = (
            retry_for_s  # > 0: ride out an outage this long instead of `attempts` tries
        )
        self.http = httpx.Client(
            base_url=url.rstrip("/") + "/api/v1/",
            timeout=timeout_s,
            transport=transport,
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": f"costlab-cli/{__version__}",
                "Accept": "application/json",
            },
        )

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict, *, idempotent: bool = False) -> Any:
        return self.request("POST", path, json=body, idempotent=idempotent)

    def patch(self, path: str, body: dict) -> Any:
        return self.request("PATCH", path, json=body, idempotent=True)

    def request(
        self, method: str, path: str, *, idempotent: bool | None = None, **kwargs: Any
    ) -> Any:
        """JSON of a 2xx answer. Retries connection failures and 429/502/503/504 when the call is
        safe to repeat: `attempts` times, or for up to `retry_for_s` seconds of outage
        (saying so on stderr)."""
        retry = method in ("GET", "HEAD") if idempotent is None else idempotent
        attempt, outage_since = 0, None
        while True:
            attempt += 1
            response, problem = None, None
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                problem = f"cannot reach {self.http.base_url}: {type(exc).__name__}: {exc}"
            if response is not None and _passing(response):
                problem = f"{method} {path}: HTTP {response.status_code}: {_reason(response)}"
            if problem is None:
                if outage_since is not None and self.retry_for_s:
                    print(
                        "costlab: reached the site again after "
                        f"{time.monotonic() - outage_since:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                return self._answer(response, method, path)
            now = time.monotonic()
            if outage_since is None:
                outage_since = now
                if retry and self.retry_for_s:
                    print(
                        f"costlab: {problem}; "
                        f"retrying for up to {self.retry_for_s:g} s (--retry-for)",
                        file=sys.stderr,
                        flush=True,
                    )
            left = self.retry_for_s - (now - outage_since) if self.retry_for_s else None
            if (
                not retry
                or (left is None and attempt >= self.attempts)
                or (left is not None and left <= 0)
            ):
                if self.retry_for_s and retry:
                    problem += (
                        f" (still failing after {now - outage_since:.0f} s; "
                        f"--retry-for {self.retry_for_s:g})"
                    )
                raise CliError(problem)
            self._sleep(
                attempt,
                response.headers.get("Retry-After") if response is not None else None,
                cap=left,
            )

    @staticmethod
    def _answer(response: httpx.Response, method: str, path: str) -> Any:
        if response.is_success:
            try:
                return response.json() if response.content else None
            except ValueError:
                raise CliError(
                    f"{method} {path}: the answer is not JSON; is COSTLAB_URL the costlab site?"
                ) from None
        reason = _reason(response)
        raise CliError(
            f"{method} {path}: HTTP {response.status_code}: {reason}",
            status=response.status_code,
            reason=reason,
        )

    @staticmethod
    def _sleep(attempt: int, retry_after: str | None = None, cap: float | None = None) -> None:
        try:
            wait = float(retry_after) if retry_after else 0.0
        except ValueError:
            wait = 0.0
        wait = wait or min(8.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + random.random())
        time.sleep(max(0.0, min(wait, 30.0, cap if cap is not None else 30.0)))


def _passing(response: httpx.Response) -> bool:
    """An answer worth waiting out: a gateway or outage status, or a throttle's 429 (which says
    when to come back in Retry-After). A 429 without one is a quota or budget refusal: waiting
    a minute does not end it, so it is reported at once."""
    if response.status_code == 429:
        return "Retry-After" in response.headers
    return response.status_code in RETRY_STATUSES


def _reason(response: httpx.Response) -> str:
    """The message of costlab's error body, or the first line of whatever came back."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        lines = response.text.strip().splitlines()
        return lines[0][:200] if lines else response.reason_phrase


def print_warnings(command: str, answer: Any) -> None:
    """Each of an answer's `warnings` on stderr, one line each: "costlab COMMAND: warning: ...".
    A warning is an object with a `message` (arms: a dtype emulated or slower than fp32 on a
    queue's devices) or a plain string (sweeps)."""
    warnings = answer.get("warnings") if isinstance(answer, dict) else None
    for warning in warnings or []:
        text = warning.get("message", warning) if isinstance(warning, dict) else warning
        print(f"costlab {command}: warning: {text}", file=sys.stderr, flush=True)
