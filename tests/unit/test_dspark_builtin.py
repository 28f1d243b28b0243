"""The builtin DSpark pair, offline: its checkpoints have the parameters specwake.prepare.models declares, and the
drafter's construction (specwake/worker/dspark.py) holds through a forward written here the way vLLM's DSpark computes
one (qwen3_dflash.py, v1/worker/gpu/spec_decode/dspark/speculator.py; rotary embeddings left out: they turn the gate's
dimensions by < 3e-6 rad a position). Intact, the block proposes the target's next K tokens; with the fused
context-KV copies zeroed, as a reload that does not rebuild them leaves them, every proposal is a poison token.
The real-vLLM run (tests/e2e/test_dspark.py) measures AL."""

from __future__ import annotations

import re

import pytest

from tests.helpers.procs import require_module

require_module("torch")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specwake.prepare.models import lookup  # noqa: E402
from specwake.worker import bigram, dspark  # noqa: E402
from specwake.worker.build import BUILDERS  # noqa: E402
from tests.helpers.paths import REPO  # noqa: E402

TARGET, DRAFT = "dspark-qwen3", "dspark-qwen3-draft"
K = dspark.BLOCK
PROMPT = [ord(c) for c in "The quick brown fox jumps over"]  # any history: every context key is alike
ANCHORS = [*range(32, 127), 10, 0, 256]  # printable, then a newline, NUL and BOS


@pytest.fixture(scope="module")
def pair() -> tuple[dict[str, torch.Tensor], dict, dict[str, torch.Tensor]]:
    _, target = BUILDERS[TARGET](TARGET)
    config, draft = BUILDERS[DRAFT](DRAFT)
    return target, config, draft


def rms(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


def mlp(x: torch.Tensor, w: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    gate, up, down = (w[f"{prefix}.mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def context_states(target: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """The target's states after layers 0 and 1 (vLLM's aux states for target_layer_ids [0, 1]), concatenated;
    attention ≈ 0 (its weights are 1e-3 noise)."""
    h = target["model.embed_tokens.weight"][tokens]
    states = []
    for i in range(2):
        p = f"model.layers.{i}"
        h = h + mlp(rms(h, target[f"{p}.post_attention_layernorm.weight"]), target, p)
        states.append(h)
    return torch.cat(states, dim=-1)


def head(x: torch.Tensor, index: int) -> torch.Tensor:
    return x[..., index * 64 : (index + 1) * 64]


def propose(
    target: dict[str, torch.Tensor], draft: dict[str, torch.Tensor], anchors: list[int], fused: bool
) -> torch.Tensor:
    """One DSpark draft step per anchor, all at once ([anchors, K] proposals), each after PROMPT and the anchor as
    context (head 0 of the attention; head 1 is noise): context K/V from the fused copies (zeros with
    `fused=False`), the block [anchor, mask, mask] attending to context and block, then Markov sampling."""
    a = "layers.0.self_attn"
    wq, wk, wv = (draft[f"{a}.{p}_proj.weight"] for p in "qkv")
    n = len(anchors)
    states = rms(context_states(target, [*PROMPT, *anchors]) @ draft["fc.weight"].T, draft["hidden_norm.weight"])
    k_ctx = rms(head(states @ wk.T, 0), draft[f"{a}.k_norm.weight"]) * fused
    v_ctx = head(states @ wv.T, 0) * fused
    own = len(PROMPT) + torch.arange(n)  # each anchor's own context row, after the prompt's
    prompt = slice(0, len(PROMPT))
    block = torch.tensor([[anchor] + [dspark.MASK_TOKEN] * (K - 1) for anchor in anchors])
    embedded = target["model.embed_tokens.weight"][block]  # vLLM gives the drafter the target's embedding
    x = rms(embedded, draft["layers.0.input_layernorm.weight"])
    q = rms(head(x @ wq.T, 0), draft[f"{a}.q_norm.weight"])
    k_blk = rms(head(x @ wk.T, 0), draft[f"{a}.k_norm.weight"])
    keys = torch.cat([k_ctx[prompt].expand(n, -1, -1), k_ctx[own, None], k_blk], dim=1)
    values = torch.cat([v_ctx[prompt].expand(n, -1, -1), v_ctx[own, None], head(x @ wv.T, 0)], dim=1)
    attended = torch.softmax(q @ keys.transpose(1, 2) / 8.0, dim=-1) @ values  # non-causal: all see all
    out = torch.cat([attended, torch.zeros_like(attended)], dim=-1) @ draft[f"{a}.o_proj.weight"].T
    residual = embedded + out
    residual = residual + mlp(rms(residual, draft["layers.0.post_attention_layernorm.weight"]), draft, "layers.0")
    base = rms(residual, draft["norm.weight"]) @ draft["lm_head.weight"].T
    proposals, prev = [], torch.tensor(anchors)
    for i in range(K):  # the sequential stage: the Markov bias from the token sampled before
        bias = draft["markov_head.markov_w1.weight"][prev] @ draft["markov_head.markov_w2.weight"].T
        prev = (base[:, i] + bias).argmax(-1)
        proposals.append(prev)
    return torch.stack(proposals, dim=1)


def chains(anchors: list[int]) -> torch.Tensor:
    rows = []
    for token in anchors:
        row = []
        for _ in range(K):
            token = bigram.next_token(token)
            row.append(token)
        rows.append(row)
    return torch.tensor(rows)


@pytest.mark.parametrize("name", [TARGET, DRAFT])
def test_the_registry_counts_every_parameter_the_generator_writes(name: str) -> None:
    _, weights = BUILDERS[name](name)
    assert sum(t.numel() for t in weights.values()) == lookup(name).parameters
    assert not any(bool((t == 0).any()) for t in weights.values())  # a zeroed tensor can only be a discarded one


def test_the_drafter_is_the_architecture_vllm_registers_as_dspark(pair) -> None:
    _, config, draft = pair
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["block_size"] == K
    assert config["dflash_config"]["mask_token_id"] == config["dspark_noise_token_id"] == dspark.MASK_TOKEN
    # the target's embedding is shared (none shipped); vLLM drops a shipped mask_embedding (qwen3_dspark.py)
    assert not any(n.startswith(("embed_tokens", "mask_embedding")) for n in draft)
    assert draft["fc.weight"].shape == (128, 2 * 128) and draft["markov_head.markov_w1.weight"].shape == (320, 96)


def test_an_intact_drafter_proposes_the_targets_next_k_tokens(pair) -> None:
    target, _, draft = pair
    assert torch.equal(propose(target, draft, ANCHORS, fused=True), chains(ANCHORS))


def test_zeroed_fused_copies_make_every_proposal_a_poison_token(pair) -> None:
    target, _, draft = pair
    proposals = propose(target, draft, ANCHORS, fused=False)
    assert set(proposals.flatten().tolist()) <= {dspark.POISON_UP, dspark.POISON_DOWN}, proposals


def test_the_gate_margin_holds_for_every_token_as_context(pair) -> None:
    """A context key outscores a block key by ≥ 14 logits whatever token the context state came from."""
    target, _, draft = pair
    a = "layers.0.self_attn"
    wq, wk = draft[f"{a}.q_proj.weight"], draft[f"{a}.k_proj.weight"]
    tokens = list(range(320))
    context = rms(context_states(target, tokens) @ draft["fc.weight"].T, draft["hidden_norm.weight"])
    x = rms(target["model.embed_tokens.weight"][tokens], draft["layers.0.input_layernorm.weight"])
    q = rms(head(x @ wq.T, 0), draft[f"{a}.q_norm.weight"])
    k_ctx = rms(head(context @ wk.T, 0), draft[f"{a}.k_norm.weight"])
    k_blk = rms(head(x @ wk.T, 0), draft[f"{a}.k_norm.weight"])
    margin = (q @ k_ctx.T).min() / 8 - (q @ k_blk.T).max() / 8
    assert margin > 14.0, float(margin)


def test_the_fooling_fixture_is_the_reference_fix_less_its_fused_rebuild() -> None:
    """tests/data/dspark-no-fused-rebuild.diff (tests/e2e/test_dspark.py): the reference fix's hunks with exactly the
    rebuild of the fused context-KV buffers after finalize_layerwise_reload taken out (its new file that much
    shorter)."""
    fix = (REPO / "scenarios" / "patches" / "draft-reload.diff").read_text()
    fooling = (REPO / "tests" / "data" / "dspark-no-fused-rebuild.diff").read_text()
    start = fix.index("+    # DFlash / DSpark drafters stack")
    rebuild = fix[start : fix.index("+    # The rebuilds allocate new tensors")]
    assert "rebuild()" in rebuild and "rebuild()" not in fooling
    size = int(re.search(r"@@ -0,0 \+1,(\d+) @@", fix)[1])  # the new reload/draft.py, the patch's first file
    shorter = f"@@ -0,0 +1,{size - rebuild.count(chr(10))} @@"
    body = fix[fix.index("diff --git ") :].replace(rebuild, "").replace(f"@@ -0,0 +1,{size} @@", shorter, 1)
    assert fooling[fooling.index("diff --git ") :] == body
