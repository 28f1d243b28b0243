"""An in-memory stand-in for vLLM's HTTP surface, served through httpx.MockTransport.

It keeps spec-decode counters the way vLLM does (drafts, draft tokens, accepted, per position) so the
measurement and cycle code can be exercised without a server. It is a test double for the *server*,
never for the code under test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx


@dataclass
class MockVllm:
    k: int = 3
    draft_ok: bool = True  # whether the drafter's weights are intact
    reload_restores_draft: bool = False  # the patched behaviour
    fail: dict[str, int] = field(default_factory=dict)  # path or rpc method -> HTTP status to answer
    prefix_reset_fails: bool = False  # /reset_prefix_cache answers 200 {"success": false}, as vLLM does
    hang: set[str] = field(default_factory=set)  # paths/methods that time out
    lag_metrics: int = 0  # answer this many /metrics scrapes with stale counters
    drafts: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)
    generated: int = 0
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.per_pos = [0] * self.k
        self._stale: str | None = None

    def metrics(self) -> str:
        lines = [
            "# TYPE vllm:spec_decode_num_drafts counter",
            f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {self.drafts}.0',
            'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9',
            "# TYPE vllm:spec_decode_num_draft_tokens counter",
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {self.drafts * self.k}.0',
            "# TYPE vllm:spec_decode_num_accepted_tokens counter",
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {self.accepted}.0',
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{p}"}} {v}.0'
            for p, v in enumerate(self.per_pos)
        ]
        lines += [
            "# TYPE vllm:generation_tokens counter",
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {self.generated}.0',
        ]
        return "\n".join(lines) + "\n"

    def generate(self, prompt: str, max_tokens: int) -> str:
        produced = 0
        while produced < max_tokens:
            self.drafts += 1
            taken = self.k if self.draft_ok else 0
            for p in range(taken):
                self.per_pos[p] += 1
            self.accepted += taken
            produced += taken + 1
        produced = max_tokens
        self.generated += produced
        return ("echo:" + prompt)[:max_tokens]

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
            text = self.metrics()
            if self.lag_metrics > 0 and self._stale is not None:
                self.lag_metrics -= 1
                text = self._stale
            self._stale = text
            return httpx.Response(200, text=text)
        if path == "/v1/completions":
            text = self.generate(body["prompt"], body["max_tokens"])
            return httpx.Response(
                200,
                json={
                    "choices": [{"text": text}],
                    "usage": {"completion_tokens": body["max_tokens"]},
                },
            )
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if key == "specwake_emulate_discard":
            self.draft_ok = False
            return httpx.Response(200, json={"results": [{"zeroed": 10}]})
        if key == "reload_weights":
            if self.reload_restores_draft:
                self.draft_ok = True
            return httpx.Response(200)
        if path == "/reset_prefix_cache":
            return httpx.Response(200, json={"success": not self.prefix_reset_fails})
        if path in ("/sleep", "/wake_up", "/health", "/collective_rpc"):
            return httpx.Response(200, json={"results": [None]} if path == "/collective_rpc" else None)
        return httpx.Response(404, text="not found")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(self.handler))
