"""The SDK's calls to costlab's REST API v1, on the CLI's client (COSTLAB_URL, COSTLAB_TOKEN,
bearer token), with the SDK's own retry rule: an answer that will not change (4xx, a quota's
429) is raised at once as ``Refused``; an outage (unreachable, 408, a throttle's 429, 5xx) is
retried with backoff for as long as the caller allows, then raised as ``Unreachable``."""

from __future__ import annotations

import random
import time
from typing import Any

import httpx

from costlab.delivery import Refused, say
from costlab_cli.client import Api

TRANSIENT = {408, 425, 500, 502, 503, 504}
__version__ = "0.1.0"


def _passing(response: httpx.Response) -> bool:
    """An answer worth waiting out: an outage's status, or a throttle's 429 (it says when to come
    back, Retry-After). A 429 without one is a quota or budget refusal: it is raised at once."""
    if response.status_code == 429:
        return "Retry-After" in response.headers
    return response.status_code in TRANSIENT


def _code(response: httpx.Response) -> str:
    """The code of costlab's error body (``run_finished``, ...), else ""."""
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def _reason(response: httpx.Response) -> str:
    """The message of costlab's error body, or the first line of whatever came back."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        lines = response.text.strip().splitlines()
        return lines[0][:200] if lines else response.reason_phrase


class Unreachable(ConnectionError):
    """The site did not answer usefully within the time allowed."""


class Client:
    def __init__(self, url: str | None = None, token: str | None = None):
        self.api = Api(url, token, timeout_s=10.0, attempts=1)
        self.http = self.api.http
        self.http.headers["User-Agent"] = f"costlab-sdk/{__version__}"
        self.base_url = str(self.http.base_url)

    def close(self) -> None:
        self.api.close()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        retry_for_s: float = 0.0,
        timeout_s: float = 10.0,
        params: dict | None = None,
    ) -> Any:
        """JSON of a 2xx answer. Call only what is safe to repeat (every SDK call is: run keys,
        sticky assignment, seq)."""
        give_up = time.monotonic() + retry_for_s
        attempt, said = 0, False
        while True:
            attempt += 1
            try:
                response = self.http.request(
                    method, path, json=body, params=params, timeout=timeout_s
                )
            except httpx.TransportError as exc:
                problem = f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    try:
                        return response.json() if response.content else None
                    except ValueError:
                        raise Refused(
                            response.status_code, "the answer is not JSON: is this costlab?"
                        ) from None
                if not _passing(response):
                    raise Refused(
                        response.status_code,
                        f"{method} {path}: {_reason(response)}",
                        _code(response),
                    )
                problem = f"{method} {path}: HTTP {response.status_code}: {_reason(response)}"
            left = give_up - time.monotonic()
            if left <= 0:
                raise Unreachable(problem)
            if not said:
                say(f"{problem}; retrying for up to {retry_for_s:.0f} s")
                said = True
            wait = min(8.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + random.random())
            time.sleep(max(0.0, min(wait, left)))

    def post_samples(self, run_id: int, samples: list[dict], timeout_s: float) -> dict | None:
        """One telemetry batch, once: Refused for a 4xx that is not an outage; anything else
        raised is an outage the sender retries."""
        try:
            response = self.http.post(
                f"runs/{run_id}/telemetry/", json={"samples": samples}, timeout=timeout_s
            )
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach {self.base_url}: {type(exc).__name__}") from None
        if response.is_success:
            return response.json() if response.content else None
        if _passing(response):
            raise Unreachable(f"HTTP {response.status_code}: {_reason(response)}")
        raise Refused(response.status_code, _reason(response), _code(response))

    def create_run(
        self,
        body: dict,
        *,
        arm_name: str | None = None,
        retry_for_s: float = 0.0,
        timeout_s: float = 10.0,
    ) -> dict:
        """Create the external run of `body` (or get the one its run key names), running; an arm
        given by name is looked up first."""
        body = dict(body)
        if arm_name is not None:
            found = self.call(
                "GET",
                "arms/",
                params={"experiment": body["experiment"], "name": arm_name},
                retry_for_s=retry_for_s,
                timeout_s=timeout_s,
            )["results"]
            if not found:
                raise Refused(404, self._no_arm(body["experiment"], arm_name, timeout_s))
            body["arm"] = found[0]["id"]
        try:
            run = self.call("POST", "runs/", body, retry_for_s=retry_for_s, timeout_s=timeout_s)
        except Refused as exc:
            if exc.status != 400 or "started_at" not in exc.reason or "started_at" not in body:
                raise
            # This host's clock runs ahead of the server's: created now instead; samples from
            # before (an outage's first seconds) fall before the run and are refused alone.
            body.pop("started_at")
            run = self.call("POST", "runs/", body, timeout_s=timeout_s)
        if run["status"] != "running":
            raise Refused(
                409,
                f"run_key {body.get('run_key')!r} names run {run['id']}, already "
                f"{run['status']}: a run key names one training job; pass a new one",
                "run_finished",
            )
        return run

    def _no_arm(self, experiment: int, arm_name: str, timeout_s: float) -> str:
        """Why no arm of that name was found: the experiment itself, or the arm."""
        try:
            self.call("GET", f"experiments/{experiment}/", timeout_s=timeout_s)
        except Refused as exc:
            if exc.status == 404:
                return f"experiment: there is no experiment {experiment} (for this token's tenant)"
            raise
        return f"arm: experiment {experiment} has no arm named {arm_name!r}"

    def end_run(
        self, run_id: int, status: str, error: str = "", *, retry_for_s: float = 30.0
    ) -> dict:
        """Finish (succeeded, failed) or cancel the run: the run's answer. Where it had already
        ended (another rank, the dashboard, an earlier try whose answer was lost):
        ``{"id", "status": how it ended ("ended" where the server did not say), "cost_usd": None,
        "already_ended": True}``."""
        try:
            if status == "cancelled":
                return self.call("POST", f"runs/{run_id}/cancel/", retry_for_s=retry_for_s)
            body = {"status": status, "error": error[-4000:]} if error else {"status": status}
            return self.call("POST", f"runs/{run_id}/finish/", body, retry_for_s=retry_for_s)
        except Refused as exc:
            if exc.status != 409 and not (exc.status == 400 and "already" in exc.reason):
                raise
            status = exc.run_ended or "ended"
            return {"id": run_id, "status": status, "cost_usd": None, "already_ended": True}
