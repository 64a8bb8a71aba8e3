"""A small synchronous client of the controller's REST API (used by the CLI, demo, bench).

A controller restart (or a kill -9 and a new one on the same state dir and port) must not
fail the commands that only read: :meth:`Client.request` retries connection errors (refused,
reset, timed out) with capped exponential backoff and jitter until ``retry_for`` seconds
have passed, and says "controller unreachable, retrying…" once on stderr. What is retried:

- every ``GET`` (reads have no side effects);
- ``POST /jobs/{id}/cancel``: cancelling twice leaves the job as cancelling once does;
- nothing else: ``submit`` and ``create_tenant`` are not idempotent (a request that reached
  the controller before the connection broke would create a second job or fail as a
  duplicate), so they fail at once with status 0 and the caller decides.

An HTTP error answer (4xx/5xx) is never retried: the controller was reached and said no.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import IO, Any
from urllib.parse import quote

import httpx

#: How long a single read keeps retrying an unreachable controller by default (seconds).
DEFAULT_RETRY_S = 60.0
#: Backoff between tries: first delay, growth and cap (seconds); each delay is jittered.
BACKOFF_FIRST_S = 0.2
BACKOFF_FACTOR = 2.0
BACKOFF_CAP_S = 5.0


class ClientError(Exception):
    """The controller answered with an error, or could not be reached (``status`` 0)."""

    def __init__(
        self, status: int, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details or []

    def render(self) -> str:
        lines = [self.message]
        for d in self.details:
            extra = f" (accepted: {d['accepted']})" if d.get("accepted") else ""
            lines.append(f"  {d.get('field', '?')}: {d.get('message', '')}{extra}")
        return "\n".join(lines)


def backoff_delays(
    first: float = BACKOFF_FIRST_S,
    factor: float = BACKOFF_FACTOR,
    cap: float = BACKOFF_CAP_S,
    rng: random.Random | None = None,
) -> Callable[[], float]:
    """A generator of capped exponential delays with "equal jitter" (half fixed, half random),
    so many clients waiting for the same restarted controller do not retry in lockstep."""
    rng = rng or random.Random()
    state = {"next": first}

    def delay() -> float:
        d = min(state["next"], cap)
        state["next"] = d * factor
        return d / 2 + rng.uniform(0, d / 2)

    return delay


def _retryable(method: str, path: str) -> bool:
    return method.upper() == "GET" or (method.upper() == "POST" and path.endswith("/cancel"))


class Client:
    """``retry_for``: seconds a retryable request keeps trying an unreachable controller
    (0 disables retrying); ``stderr``: where the one "retrying" notice goes (None: silent)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float = 30.0,
        retry_for: float = DEFAULT_RETRY_S,
        stderr: IO[str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retry_for = retry_for
        self._stderr = stderr
        self._sleep = sleep
        self._monotonic = monotonic
        self._warned = False
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, retry_until: float | None, **kwargs: Any) -> Any:
        """One request, retried on connection errors until ``retry_until`` (monotonic)."""
        delay = backoff_delays()
        while True:
            try:
                return self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                now = self._monotonic()
                if retry_until is None or now >= retry_until:
                    raise ClientError(
                        0, f"cannot reach the controller at {self.url}: {exc}"
                    ) from None
                if self._stderr is not None and not self._warned:
                    print(
                        f"coadapt: controller at {self.url} unreachable ({exc}), retrying…",
                        file=self._stderr,
                        flush=True,
                    )
                    self._warned = True
                self._sleep(min(delay(), max(retry_until - now, 0.0)))
            except httpx.HTTPError as exc:
                raise ClientError(0, f"cannot reach the controller at {self.url}: {exc}") from None

    def request(
        self, method: str, path: str, retry_until: float | None = None, **kwargs: Any
    ) -> Any:
        """Send one request; ``retry_until`` (monotonic time) overrides ``retry_for``."""
        if retry_until is None and self.retry_for > 0 and _retryable(method, path):
            retry_until = self._monotonic() + self.retry_for
        elif not _retryable(method, path):
            retry_until = None
        resp = self._send(method, path, retry_until, **kwargs)
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"message": resp.text.strip() or resp.reason_phrase}
            if not isinstance(body, dict):
                body = {"message": str(body)}
            message = body.get("message") or str(body.get("detail") or resp.reason_phrase)
            raise ClientError(
                resp.status_code, f"error {resp.status_code}: {message}", body.get("details")
            )
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    # -- endpoints ------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", "/api/v1/jobs", json=spec))

    def jobs(self, states: list[str] | None = None) -> list[dict[str, Any]]:
        return list(self.request("GET", "/api/v1/jobs", params={"state": states or []}))

    def job(self, job_id: str, retry_until: float | None = None) -> dict[str, Any]:
        return dict(self.request("GET", f"/api/v1/jobs/{job_id}", retry_until=retry_until))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("POST", f"/api/v1/jobs/{job_id}/cancel"))

    def events(self, job_id: str, after: int = 0) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/api/v1/jobs/{job_id}/events", params={"after": after}))

    def metrics(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/api/v1/jobs/{job_id}/metrics"))

    def logs(
        self, job_id: str, offset: int = 0, rank: int = 0, attempt: int | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"offset": offset, "rank": rank}
        if attempt is not None:
            params["attempt"] = attempt
        return dict(self.request("GET", f"/api/v1/jobs/{job_id}/logs", params=params))

    def cluster(self) -> dict[str, Any]:
        return dict(self.request("GET", "/api/v1/cluster"))

    def create_tenant(self, name: str) -> dict[str, Any]:
        return dict(self.request("POST", "/api/v1/tenants", json={"name": name}))

    # deployments (coadapt.deploy.api)
    def create_deployment(self, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", "/api/v1/deployments", json=spec)["deployment"])

    def deployments(self, live: bool = True) -> list[dict[str, Any]]:
        params = {"live": "true" if live else "false"}
        return list(self.request("GET", "/api/v1/deployments", params=params)["deployments"])

    def deployment(self, name: str) -> dict[str, Any]:
        """``{"deployment": {...}, "replicas": [...]}``."""
        return dict(self.request("GET", f"/api/v1/deployments/{quote(name, safe='')}"))

    def delete_deployment(self, name: str) -> dict[str, Any]:
        path = f"/api/v1/deployments/{quote(name, safe='')}"
        return dict(self.request("DELETE", path)["deployment"])

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False
