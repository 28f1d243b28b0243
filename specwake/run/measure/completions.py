"""Completions through vLLM's OpenAI API with the `openai` client, streamed: the text, each token with its logprob and
the TOP_LOGPROBS most likely tokens at its position, time to first token, time per output token, and the prompt
tokens the server served from its prefix cache.

Takes an injected `httpx.Client` (tests hand in an `httpx.MockTransport`); every request has a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from specwake.errors import InputRejected, RequestFailed, RequestTimeout

# Candidates per position that each request asks for (`logprobs=k`): where a stage's greedy tokens part from the
# fresh ones, each side's token among the other's top k marks a near-tie (the k vLLM's own model tests commonly use).
TOP_LOGPROBS = 5


@dataclass(frozen=True)
class Completion:
    text: str
    completion_tokens: int
    seconds: float  # request sent → last chunk
    ttft: float | None = None  # request sent → first token
    tokens: tuple[str, ...] = ()
    logprobs: tuple[float | None, ...] = ()  # the sampled token's logprob, one per generated token
    top_logprobs: tuple[dict[str, float], ...] = ()  # per generated token: the most likely tokens → logprob
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (None: not reported)

    @property
    def tok_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first (decode only: prefill excluded)."""
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.seconds - self.ttft) / (self.completion_tokens - 1)


DP_RANK_HEADER = "X-data-parallel-rank"  # vLLM's OpenAI server routes a request to this engine


class Completer:
    """Streams completions from one server (`http.base_url` is the server's root)."""

    def __init__(self, http: httpx.Client, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.client = openai.OpenAI(
            base_url=str(http.base_url).rstrip("/") + "/v1",
            api_key="specwake",
            http_client=http,  # type: ignore[arg-type]  # openai 3 types it as httpx2, the same API
            max_retries=0,
        )
        self.clock = clock

    def complete(
        self,
        *,
        model: str,
        prompt: str,
        max_tokens: int,
        temperature: float,
        ignore_eos: bool,
        timeout: float,
        logprobs: bool = True,
        engine: int | None = None,
    ) -> Completion:
        """One streamed completion; a deadline or a failed request raises (RequestTimeout / RequestFailed).
        `engine`: the data-parallel engine that serves it (vLLM's X-data-parallel-rank header); None: vLLM picks."""
        url = f"POST {self.client.base_url}completions"
        start = self.clock()
        deadline = start + timeout
        parts: list[str] = []
        tokens: list[str] = []
        lps: list[float | None] = []
        tops: list[dict[str, float]] = []
        first: float | None = None
        usage: Any = None
        try:
            stream = self.client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                stream=True,
                stream_options={"include_usage": True},
                logprobs=TOP_LOGPROBS if logprobs else None,
                extra_body={"ignore_eos": ignore_eos},
                extra_headers={DP_RANK_HEADER: str(engine)} if engine is not None else None,
                timeout=timeout,
            )
            with stream:
                for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices:
                        if choice.text and first is None:
                            first = self.clock() - start
                        parts.append(choice.text)
                        if choice.logprobs is not None:
                            tokens += list(choice.logprobs.tokens or [])
                            lps += list(choice.logprobs.token_logprobs or [])
                            tops += [dict(top or {}) for top in choice.logprobs.top_logprobs or []]
                    if self.clock() > deadline:
                        raise RequestTimeout(f"{url}: not finished within {timeout:g} s")
        except openai.APITimeoutError:
            raise RequestTimeout(f"{url}: no answer within {timeout:g} s") from None
        except openai.APIStatusError as exc:
            text = f"{url}: HTTP {exc.status_code}: {_message(exc)}"
            if refused_as_input(exc.status_code):
                raise InputRejected(text) from None
            raise RequestFailed(text) from None
        except openai.APIError as exc:
            raise RequestFailed(f"{url}: {type(exc).__name__}: {exc}") from None
        seconds = self.clock() - start
        if usage is None:
            raise RequestFailed(f"{url}: the stream ended without usage (vLLM sends it with include_usage)")
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        return Completion(
            text="".join(parts),
            completion_tokens=int(usage.completion_tokens),
            seconds=seconds,
            ttft=first,
            tokens=tuple(tokens),
            logprobs=tuple(lps),
            top_logprobs=tuple(tops),
            cached_tokens=None if cached is None else int(cached),
        )


def refused_as_input(status: int) -> bool:
    """An HTTP status by which the server refuses the request itself (bad input, e.g. a prompt longer than
    max_model_len: 400), not a timeout or a rate limit."""
    return 400 <= status < 500 and status not in (408, 429)


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:500]
    return str(exc.message)[:500]


class FannedCompleter(Completer):
    """Completers of a variant's several servers, one engine each (server.load_balancing): engine i is server i."""

    def __init__(self, members: list[Completer]) -> None:
        self.client, self.clock = members[0].client, members[0].clock
        self.members = members

    def complete(self, *, engine: int | None = None, **request: Any) -> Completion:
        """Request `engine` (None: the first server) from its server, which runs that engine alone."""
        return self.members[engine or 0].complete(**request)
