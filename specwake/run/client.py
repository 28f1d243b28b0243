"""HTTP calls to one vLLM server: /metrics and the dev-mode sleep/wake/RPC endpoints (completions: completions.py).

Takes an injected `httpx.Client` (tests hand in an `httpx.MockTransport`); every call has a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx

from specwake.errors import RequestFailed, RequestTimeout

# /collective_rpc passes our deadline to the workers; the HTTP call waits this much longer, so the server's own
# timeout answer (naming the worker) arrives before ours fires.
RPC_SLACK_S = 5.0


@dataclass(frozen=True)
class Answer:
    """A raw answer to a cycle step: HTTP status, decoded body, wall seconds."""

    status: int
    body: Any
    seconds: float

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def _body(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return response.text


class VllmClient:
    def __init__(self, http: httpx.Client, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.http = http
        self.clock = clock

    def request(
        self,
        method: str,
        path: str,
        *,
        timeout: float,
        params: list[tuple[str, str]] | None = None,
        json: Any = None,
    ) -> Answer:
        """One call; a deadline or a broken connection raises, any HTTP status is returned."""
        url = str(self.http.base_url).rstrip("/") + path
        # vLLM's server drops a keep-alive connection after a 500; a GET is safe to send once more.
        attempts = 2 if method == "GET" else 1
        for attempt in range(1, attempts + 1):
            start = self.clock()
            try:
                query = httpx.QueryParams(urlencode(params)) if params else None
                response = self.http.request(method, path, params=query, json=json, timeout=timeout)
            except httpx.TimeoutException:
                raise RequestTimeout(f"{method} {url}: no answer within {timeout:g} s") from None
            except httpx.TransportError as exc:
                if attempt < attempts and isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError)):
                    continue
                raise RequestFailed(f"{method} {url}: {type(exc).__name__}: {exc}") from None
            return Answer(response.status_code, _body(response), self.clock() - start)
        raise AssertionError("unreachable")

    def checked(self, method: str, path: str, *, timeout: float, **kwargs: Any) -> Answer:
        """Like `request`, but a non-2xx answer raises RequestFailed with the server's text."""
        answer = self.request(method, path, timeout=timeout, **kwargs)
        if not answer.ok:
            detail = answer.body if isinstance(answer.body, str) else _short(answer.body)
            raise RequestFailed(f"{method} {path}: HTTP {answer.status}: {detail}")
        return answer

    def model_ids(self, timeout: float = 30.0) -> list[str]:
        body = self.checked("GET", "/v1/models", timeout=timeout).body
        return [m["id"] for m in body.get("data", [])] if isinstance(body, dict) else []

    def metrics_text(self, timeout: float = 30.0) -> str:
        body = self.checked("GET", "/metrics", timeout=timeout).body
        return body if isinstance(body, str) else ""

    def collective_rpc(self, method: str, *, timeout: float, kwargs: dict[str, Any] | None = None) -> Answer:
        """Call a worker method on every worker; the answer body is `{"results": [...]}` or empty."""
        payload = {"method": method, "args": [], "kwargs": kwargs or {}, "timeout": timeout}
        return self.request("POST", "/collective_rpc", timeout=timeout + RPC_SLACK_S, json=payload)

    def rpc_results(self, method: str, *, timeout: float, kwargs: dict[str, Any] | None = None) -> list[Any]:
        """A worker method's per-worker results; raises on a non-2xx answer."""
        answer = self.collective_rpc(method, timeout=timeout, kwargs=kwargs)
        if not answer.ok:
            raise RequestFailed(f"collective_rpc {method}: HTTP {answer.status}: {_short(answer.body)}")
        body = answer.body
        return list(body.get("results", [])) if isinstance(body, dict) else []


def _short(body: Any, limit: int = 300) -> str:
    text = body if isinstance(body, str) else repr(body)
    return text if len(text) <= limit else text[:limit] + "…"
