"""An in-memory stand-in for vLLM's HTTP surface, served through httpx.MockTransport.

Its counters, completions (streamed, with logprobs and usage) and prefix cache come from tests/helpers/vllm_model.py,
the model the fake HTTP server uses too, so the two doubles cannot drift apart. It is a test double for the *server*,
never for the code under test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx

from tests.helpers.vllm_model import DONE, ServerModel, chunk_event, usage


@dataclass
class MockVllm:
    k: int = 3
    reload_restores_draft: bool = False  # the patched behaviour
    fail: dict[str, int] = field(default_factory=dict)  # path or rpc method -> HTTP status to answer
    prefix_reset_fails: bool = False  # /reset_prefix_cache answers 200 {"success": false}, as vLLM does
    stale_prefix_cache: bool = False  # /reset_prefix_cache says success but keeps the hashes
    hang: set[str] = field(default_factory=set)  # paths/methods that time out
    lag_metrics: int = 0  # answer this many /metrics scrapes with stale counters
    calls: list[str] = field(default_factory=list)
    updates: list[tuple[str, dict]] = field(default_factory=list)  # (session model, update_info) per /update_weights
    checker: bool = False  # offers /weight_checker (vLLM >= 0.32)
    engines: int = 1  # data-parallel engines: each its own counters (labelled engine="i"), routed by header
    restores_draft_on: set[int] | None = None  # with reload_restores_draft: only these engines' drafters (None: all)
    phantom_accepted: bool = False  # a metrics path counting accepted tokens never drafted (vllm_model.ServerModel)

    def __post_init__(self) -> None:
        self.model = ServerModel(model="m", k=self.k, engines=self.engines, al_fresh=self.k + 1.0,
                                 stale_prefix_cache=self.stale_prefix_cache,
                                 phantom_accepted=self.phantom_accepted)  # fmt: skip
        self._stale: str | None = None
        self._session: str | None = None  # the model a weight-transfer session updates

    def stream(self, body: dict, engine: str | None = None) -> httpx.Response:
        prompt, max_tokens = str(body["prompt"]), int(body["max_tokens"])
        steps, cached = self.model.complete(prompt, max_tokens, None if engine is None else int(engine))
        events = [chunk_event("m", "cmpl-mock", step) for step in steps]
        events += [chunk_event("m", "cmpl-mock", None, usage(prompt, max_tokens, cached)), DONE]
        return httpx.Response(200, content=b"".join(events), headers={"content-type": "text/event-stream"})

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        key = body.get("method", path) if path == "/collective_rpc" else path
        self.calls.append(f"{path}?{request.url.query.decode()}" if request.url.query else key)
        if key in self.hang:
            raise httpx.ReadTimeout("timed out", request=request)
        if key in self.fail:
            return httpx.Response(self.fail[key], json={"error": {"message": f"{key} failed on purpose"}})
        if path == "/metrics":
            text = self.model.metrics_text()
            if self.lag_metrics > 0 and self._stale is not None:
                self.lag_metrics -= 1
                text = self._stale
            self._stale = text
            return httpx.Response(200, text=text)
        if path == "/v1/completions":
            return self.stream(body, request.headers.get("X-data-parallel-rank"))
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if key == "specwake_emulate_discard":
            self.model.discard()
            return httpx.Response(200, json={"results": [{"filled_elements": 10}]})
        if key == "reload_weights":
            self.model.reload(draft_too=self.reload_restores_draft, engines=self.restores_draft_on)
            return httpx.Response(200)
        if path in ("/start_weight_update", "/start_draft_weight_update"):
            self._session = "draft" if "draft" in path else "target"
            return httpx.Response(200, json={"message": "Weight update started"})
        if path == "/update_weights":
            assert self._session is not None, "update_weights outside a session"
            self.updates.append((self._session, body["update_info"]))
            return httpx.Response(200, json={"message": "Weights updated"})
        if path == "/finish_weight_update":  # like the layerwise reload at a session's end: that model is back
            if self._session == "target":
                self.model.reload()
            else:
                self.model.discarded = False
            self._session = None
            return httpx.Response(200, json={"message": "Weight update finished"})
        if path == "/init_weight_transfer_engine":
            return httpx.Response(200, json={"message": "Weight transfer initialized"})
        if path == "/weight_checker" and self.checker:
            sums = {"tp0:w": "0" * 64}
            if body["action"] == "compare":
                return httpx.Response(200, json={"match": body["baseline"] == sums, "mismatches": []})
            return httpx.Response(200, json={"checksums": sums})
        if path == "/reset_prefix_cache":
            success = self.model.reset_prefix_cache() and not self.prefix_reset_fails
            return httpx.Response(200, json={"success": success})
        if path in ("/sleep", "/wake_up", "/health", "/collective_rpc"):
            return httpx.Response(200, json={"results": [None]} if path == "/collective_rpc" else None)
        return httpx.Response(404, text="not found")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(self.handler))
