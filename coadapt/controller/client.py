"""A small synchronous client of the controller's REST API (used by the CLI, demo, bench)."""

from __future__ import annotations

from typing import Any

import httpx


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


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(0, f"cannot reach the controller at {self.url}: {exc}") from None
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

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/api/v1/jobs/{job_id}"))

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

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False
