"""A small client of costlab's REST API v1: bearer token, retries on transient failures, one error type."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import httpx

from costlab_cli import __version__

RETRY_STATUSES = {429, 502, 503, 504}


class CliError(Exception):
    """Anything that ends a command with exit status 2; the message is the one-line reason."""


class Api:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout_s: float = 30.0,
                 attempts: int = 4, transport: httpx.BaseTransport | None = None):
        url = (url or os.environ.get("COSTLAB_URL", "")).strip()
        token = (token or os.environ.get("COSTLAB_TOKEN", "")).strip()
        if not url:
            raise CliError("COSTLAB_URL is not set (e.g. https://costlab.example.com)")
        if not token:
            raise CliError("COSTLAB_TOKEN is not set (mint one: manage.py api_token_create --tenant SLUG --name ci)")
        if not url.startswith(("http://", "https://")):
            raise CliError(f"COSTLAB_URL must start with http:// or https://, got {url!r}")
        self.attempts = attempts
        self.http = httpx.Client(
            base_url=url.rstrip("/") + "/api/v1/", timeout=timeout_s, transport=transport,
            headers={"Authorization": f"Bearer {token}", "User-Agent": f"costlab-cli/{__version__}",
                     "Accept": "application/json"},
        )

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict, *, idempotent: bool = False) -> Any:
        return self.request("POST", path, json=body, idempotent=idempotent)

    def patch(self, path: str, body: dict) -> Any:
        return self.request("PATCH", path, json=body, idempotent=True)

    def request(self, method: str, path: str, *, idempotent: bool | None = None, **kwargs: Any) -> Any:
        """JSON of a 2xx answer. Retries connection failures and 429/502/503/504 when the call is safe to repeat."""
        retry = method in ("GET", "HEAD") if idempotent is None else idempotent
        for attempt in range(1, self.attempts + 1):
            last = attempt == self.attempts or not retry
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if last:
                    raise CliError(f"cannot reach {self.http.base_url}: {type(exc).__name__}: {exc}") from None
                self._sleep(attempt)
                continue
            if response.status_code in RETRY_STATUSES and not last:
                self._sleep(attempt, response.headers.get("Retry-After"))
                continue
            if response.is_success:
                try:
                    return response.json() if response.content else None
                except ValueError:
                    raise CliError(f"{method} {path}: the answer is not JSON; is COSTLAB_URL the costlab site?") \
                        from None
            raise CliError(f"{method} {path}: HTTP {response.status_code}: {_reason(response)}")
        raise AssertionError("unreachable")

    @staticmethod
    def _sleep(attempt: int, retry_after: str | None = None) -> None:
        try:
            wait = float(retry_after) if retry_after else 0.0
        except ValueError:
            wait = 0.0
        wait = wait or min(8.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + random.random())
        time.sleep(min(wait, 30.0))


def _reason(response: httpx.Response) -> str:
    """The message of costlab's error body, or the first line of whatever came back."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        lines = response.text.strip().splitlines()
        return lines[0][:200] if lines else response.reason_phrase
