"""One model of what a vLLM server counts and answers, shared by the two test doubles of the server: the in-process
MockTransport (tests/helpers/mock_vllm.py) and the fake HTTP server (tests/helpers/fake_server.py). Stdlib only.

- Spec-decode counters as vLLM keeps them (drafts, draft tokens, accepted, accepted per position, generated
  tokens), rendered as Prometheus text; or, to plant a broken metrics path, an accepted total that disagrees with
  them (phantom_accepted).
- Completions: N tokens decoded in D = round(N / AL) draft steps of K draft tokens; one streamed chunk per step
  (vLLM sends a decode step's tokens together), each token with its logprob; garbage ("!") while the target is
  discarded. The final chunk carries usage, with prompt_tokens_details.cached_tokens.
- A prefix cache of 4-word blocks: a prompt whose leading blocks were seen before reports them as cached, until
  /reset_prefix_cache clears the cache (or does not, to play the stale-hash bug).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

BLOCK_WORDS = 4  # prompt "tokens" are words here; a cache block holds this many


@dataclass
class Counters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    generation: int = 0
    per_pos: list[int] = field(default_factory=list)


@dataclass
class ServerModel:
    """The state behind one fake server; callers hold their own lock."""

    model: str = "fake-model"
    k: int = 3
    engines: int = 1
    al_fresh: float = 4.0
    al_after: float = 1.0
    prefix_cache: bool = True
    stale_prefix_cache: bool = False  # /reset_prefix_cache answers success but keeps the hashes
    # a metrics path that counts accepted tokens it never drafted: once the weights are discarded the accepted total
    # grows as at al_fresh over the drafts really made, while drafts and the per-position counts say what was drafted
    phantom_accepted: bool = False
    discarded: bool = False  # weights were discarded at least once: AL is al_after from then on
    # with several engines: those whose drafter a reload restored since the discard (AL al_fresh again)
    drafter_back: set[int] = field(default_factory=set)
    target_zeroed: bool = False  # discarded and not reloaded since: completions are garbage
    requests: int = 0
    cached_blocks: dict[int, set[tuple[str, ...]]] = field(default_factory=dict)  # per engine: each has its own
    counters: list[Counters] = field(default_factory=list)
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.reset_counters()

    def reset_counters(self) -> None:
        self.created = time.time()
        self.counters = [Counters(per_pos=[0] * self.k) for _ in range(self.engines)]

    # -- weights ---------------------------------------------------------------------------------

    def discard(self) -> None:
        self.discarded = self.target_zeroed = True
        self.drafter_back.clear()

    def reload(self, draft_too: bool = False, engines: set[int] | None = None) -> None:
        """The target back on every engine; the drafter too where `draft_too`, on `engines` only when given."""
        self.target_zeroed = False
        if draft_too and engines is None:
            self.discarded = False
        elif draft_too:
            self.drafter_back |= engines

    def acceptance_length(self, engine: int = 0) -> float:
        al = self.al_after if self.discarded and engine not in self.drafter_back else self.al_fresh
        return min(max(al, 1.0), self.k + 1.0)

    # -- prefix cache ----------------------------------------------------------------------------

    def reset_prefix_cache(self) -> bool:
        if not self.stale_prefix_cache:
            self.cached_blocks.clear()
        return True

    def cached_tokens(self, prompt: str, engine: int = 0) -> int:
        """Leading prompt words served from `engine`'s cache; the prompt's blocks are cached there from now on."""
        cached = self.cached_blocks.setdefault(engine, set())
        words = prompt.split()
        blocks = [tuple(words[: i + BLOCK_WORDS]) for i in range(0, len(words) - BLOCK_WORDS + 1, BLOCK_WORDS)]
        hit = 0
        for block in blocks:
            if block not in cached:
                break
            hit = len(block)
        if self.prefix_cache:
            cached.update(blocks)
            return hit
        return 0

    # -- completions -----------------------------------------------------------------------------

    def complete(
        self, prompt: str, max_tokens: int, on: int | None = None
    ) -> tuple[list[list[tuple[str, float]]], int]:
        """Decode `max_tokens` tokens on engine `on` (None: the engines in turn): (steps, each a list of (token,
        logprob)), cached prompt tokens)."""
        index = self.requests % self.engines if on is None else on
        cached = self.cached_tokens(prompt, index)
        engine = self.counters[index]
        self.requests += 1
        al = self.acceptance_length(index)
        drafts = max(1, round(max_tokens / al))
        accepted = min(max(0, max_tokens - drafts), drafts * self.k)
        engine.drafts += drafts
        engine.draft_tokens += drafts * self.k
        phantom = self.phantom_accepted and al < self.al_fresh
        engine.accepted += min(round((self.al_fresh - 1.0) * drafts), drafts * self.k) if phantom else accepted
        engine.generation += max_tokens
        base, extra = divmod(accepted, drafts)  # each draft accepts a prefix of its K tokens
        for pos in range(self.k):
            engine.per_pos[pos] += drafts if pos < base else extra if pos == base else 0
        tokens = [self.token(prompt, i) for i in range(max_tokens)]
        size = -(-max_tokens // drafts)
        return [tokens[i : i + size] for i in range(0, max_tokens, size)], cached

    def token(self, prompt: str, index: int) -> tuple[str, float]:
        if self.target_zeroed:
            return "!", -5.0
        seed = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
        return f" w{(seed + index * 7) % 97}", -0.01 * ((seed + index) % 7) - 0.001

    # -- rendering -------------------------------------------------------------------------------

    def metrics_text(self, spec_metrics: bool = True) -> str:
        out: list[str] = []
        series = [("drafts", "vllm:spec_decode_num_drafts"), ("draft_tokens", "vllm:spec_decode_num_draft_tokens")]
        series += [("accepted", "vllm:spec_decode_num_accepted_tokens"), ("generation", "vllm:generation_tokens")]
        if not spec_metrics:
            series = series[-1:]
        for key, name in series:
            out += [f"# HELP {name} Fake counter {key}.", f"# TYPE {name} counter"]
            for e, c in enumerate(self.counters):
                labels = f'engine="{e}",model_name="{self.model}"'
                out.append(f"{name}_total{{{labels}}} {float(getattr(c, key))}")
                out.append(f"{name}_created{{{labels}}} {self.created}")
        if spec_metrics:
            name = "vllm:spec_decode_num_accepted_tokens_per_pos"
            out += [f"# HELP {name} Fake per-position counter.", f"# TYPE {name} counter"]
            for e, c in enumerate(self.counters):
                for pos, value in enumerate(c.per_pos):
                    labels = f'engine="{e}",model_name="{self.model}",position="{pos}"'
                    out.append(f"{name}_total{{{labels}}} {float(value)}")
        return "\n".join(out) + "\n"


def chunk_event(model: str, request_id: str, step: list[tuple[str, float]] | None, usage: dict | None = None) -> bytes:
    """One server-sent event of a streamed /v1/completions answer (vLLM's shape)."""
    if step is None:
        body = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        body |= {"choices": [], "usage": usage}
    else:
        logprobs = {
            "text_offset": [0] * len(step),
            "token_logprobs": [lp for _, lp in step],
            "tokens": [t for t, _ in step],
            "top_logprobs": [{t: lp} for t, lp in step],
        }
        choice = {"index": 0, "text": "".join(t for t, _ in step), "logprobs": logprobs, "finish_reason": None}
        body = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        body |= {"choices": [choice], "usage": None}
    return f"data: {json.dumps(body)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


def usage(prompt: str, completion_tokens: int, cached: int) -> dict:
    prompt_tokens = len(prompt.split())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
