"""The routing service's admin API, as the retrain flow and the planner use it: samples, models, publish, rollback.

Errors are sorted by what a retry can fix. An unreachable service, a timeout,
a dropped connection or a 5xx answer raise `RouterUnavailableError` (a
ConnectionError, so the flow's tasks retry it); anything else the service
refuses (401/403 token, 404, 409, 413, 422) raises `RouterRequestError` (a
ValueError: no retry) with the status, the service's message and what was
being done. The bearer token is read by the caller from the environment and
is never logged.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx

DEFAULT_TIMEOUT_S = 30.0
PAGE_LIMIT = 10_000


class RouterUnavailableError(ConnectionError):
    """The routing service could not be reached or answered 5xx (worth retrying)."""


class RouterRequestError(ValueError):
    """The routing service refused the request (not worth retrying)."""

    def __init__(self, message: str, *, status: int, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class RouterAdminClient:
    """HTTP client for one routing service (base_url like http://router:8080)."""

    def __init__(self, base_url: str, *, token: str | None, timeout_s: float = DEFAULT_TIMEOUT_S):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"router url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RouterAdminClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------

    def iter_sample_pages(self, *, after_seq: int = 0, limit: int = PAGE_LIMIT) -> Iterator[dict]:
        """Pages of GET /v1/samples from after_seq to the newest (each the service's JSON)."""
        while True:
            page = self._call("GET", "/v1/samples", "reading training samples",
                              params={"after_seq": after_seq, "limit": limit})
            yield page
            if not page["has_more"] or page["next_after_seq"] <= after_seq:
                return
            after_seq = page["next_after_seq"]

    def models(self) -> dict:
        """GET /v1/models: {"active", "estimate", "prediction", "versions": [...]}."""
        return self._call("GET", "/v1/models", "listing published models")

    def model(self, version: str) -> dict:
        """A retained model document."""
        return self._call("GET", f"/v1/models/{version}", f"reading model {version}")

    def active_model(self) -> tuple[dict, dict] | None:
        """(the active version's GET /v1/models entry: version, published_at_s, metrics; its document), or None
        when no model is active."""
        listing = self.models()
        active = listing.get("active")
        if not active:
            return None
        entry = next((v for v in listing.get("versions", []) if v.get("version") == active), None)
        if entry is None:
            raise RouterRequestError(f"listing published models: active version {active} is not among the versions",
                                     status=200)
        return entry, self.model(active)

    def publish(self, document: dict) -> dict:
        """POST /v1/models; returns {"version", "active"}.

        Idempotent across retries: when the version already exists and holds
        this very document (an earlier attempt landed but its answer was lost),
        that counts as published. Any other 409 raises RouterRequestError.
        """
        version = document.get("version")
        try:
            return self._call("POST", "/v1/models", f"publishing model {version}", json=document)
        except RouterRequestError as exc:
            if exc.status != 409:
                raise
            stored = self.model(version)
            if _same_document(stored, document):
                listing = self.models()
                return {"version": version, "active": listing.get("active") == version}
            raise

    def rollback(self, *, to_version: str | None = None) -> dict:
        """POST /v1/models/rollback; returns {"active", "estimate"}."""
        what = f"rolling back to {to_version}" if to_version else "rolling back to the previous model"
        return self._call("POST", "/v1/models/rollback", what, json={"to_version": to_version})

    # -- internals -------------------------------------------------------------

    def _call(self, method: str, path: str, doing: str, **kwargs) -> dict:
        url = f"{self.base_url}{path}"
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise RouterUnavailableError(f"{doing}: {method} {url} timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise RouterUnavailableError(f"{doing}: {method} {url} failed: {exc or type(exc).__name__}") from None
        if resp.status_code >= 500:
            raise RouterUnavailableError(f"{doing}: {method} {url}: HTTP {resp.status_code} {_message(resp)}")
        if resp.status_code >= 400:
            code = None
            try:
                code = resp.json().get("error")
            except ValueError:
                pass
            raise RouterRequestError(
                f"{doing}: {method} {url}: HTTP {resp.status_code} {_message(resp)}", status=resp.status_code, code=code
            )
        try:
            return resp.json()
        except ValueError:
            raise RouterUnavailableError(f"{doing}: {method} {url}: answer is not JSON: {resp.text[:200]!r}") from None


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        return str(body.get("message") or body)[:500]
    except ValueError:
        return resp.text[:500]


def _same_document(stored: dict, sent: dict) -> bool:
    # The service echoes the validated document: defaults filled in, numbers as JSON floats.
    keys = ("version", "targets", "metrics")
    return all(_normalise(stored.get(k)) == _normalise(sent.get(k)) for k in keys)


def _normalise(v):
    if isinstance(v, dict):
        return {k: _normalise(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_normalise(x) for x in v]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return v
