"""The builtin draft_model pair, offline: `tiny-llama-draft` is another checkpoint than `tiny-llama` (its matrices
differ element by element) that computes the same function (a full Llama forward pass, attention and rotary
embeddings included, gives both the same logits), and a reordering applied inconsistently would not."""

from __future__ import annotations

import pytest

from tests.helpers.procs import require_module

require_module("torch")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specwake.worker import tiny_llama  # noqa: E402
from specwake.worker.build import BUILDERS  # noqa: E402
from specwake.worker.tiny_llama import HEAD_DIM, HEADS  # noqa: E402

# Prompt-like token ids: ASCII, UTF-8 continuation and lead bytes, BOS.
TOKENS = torch.tensor([256, 72, 105, 32, 206, 186, 207, 129, 0, 127, 226, 130, 172, 240, 159, 152, 128, 10])


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotary embedding (halves rotated) on [heads, positions, head_dim]."""
    half = HEAD_DIM // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * freqs[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def logits(config: dict, w: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """A plain causal Llama forward pass over `tokens`: [positions, vocab]."""
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    h = w["model.embed_tokens.weight"][tokens]
    n = len(tokens)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        x = rms(h, w[f"{p}.input_layernorm.weight"], eps)
        q, k, v = (
            (x @ w[f"{p}.self_attn.{name}_proj.weight"].T).view(n, HEADS, HEAD_DIM).transpose(0, 1)
            for name in ("q", "k", "v")
        )
        attended = F.scaled_dot_product_attention(rotary(q, theta), rotary(k, theta), v, is_causal=True)
        h = h + attended.transpose(0, 1).reshape(n, HEADS * HEAD_DIM) @ w[f"{p}.self_attn.o_proj.weight"].T
        x = rms(h, w[f"{p}.post_attention_layernorm.weight"], eps)
        mlp = F.silu(x @ w[f"{p}.mlp.gate_proj.weight"].T) * (x @ w[f"{p}.mlp.up_proj.weight"].T)
        h = h + mlp @ w[f"{p}.mlp.down_proj.weight"].T
    return rms(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


@pytest.fixture(scope="module")
def pair() -> tuple[dict, dict[str, torch.Tensor], dict, dict[str, torch.Tensor]]:
    target_config, target = BUILDERS["tiny-llama"]("tiny-llama")
    draft_config, draft = BUILDERS["tiny-llama-draft"]("tiny-llama-draft")
    return target_config, target, draft_config, draft


def test_the_drafter_is_another_checkpoint_of_the_same_shape(pair) -> None:
    target_config, target, draft_config, draft = pair
    assert draft_config == target_config
    assert {k: t.shape for k, t in draft.items()} == {k: t.shape for k, t in target.items()}
    same = sorted(k for k in target if torch.equal(target[k], draft[k]))
    # Only the norms read alike: their weights are all ones, which no reordering changes.
    assert same == sorted(k for k in target if k.endswith("norm.weight"))
    for name in (k for k in target if k not in same):
        nonzero = target[name] != 0  # the head's rows of non-printable tokens are zero in both
        moved = (target[name] != draft[name])[nonzero].float().mean().item()
        assert moved > 0.9, f"{name}: only {moved:.0%} of its non-zero elements moved"
        # the same elements, elsewhere: what a per-tensor sum cannot tell apart
        assert torch.equal(target[name].flatten().sort().values, draft[name].flatten().sort().values), name


def test_the_drafter_computes_the_targets_function(pair) -> None:
    target_config, target, draft_config, draft = pair
    want, got = logits(target_config, target, TOKENS), logits(draft_config, draft, TOKENS)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert want.std() > 1.0  # logits with clear winners: agreement above is not agreement of near-zeros


@pytest.mark.parametrize(
    "name",
    ["model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.v_proj.weight", "lm_head.weight"],
)
def test_an_inconsistent_reordering_changes_the_function(pair, name: str) -> None:
    """The check above has teeth: undo the reordering of one tensor alone and the logits part."""
    target_config, target, _, draft = pair
    broken = {**draft, name: target[name]}
    assert not torch.allclose(logits(target_config, broken, TOKENS), logits(target_config, target, TOKENS), atol=1e-2)


def test_the_reordering_is_seeded(pair) -> None:
    _, target, _, draft = pair
    assert all(torch.equal(draft[k], t) for k, t in tiny_llama.reordered(target).items())
    other = tiny_llama.reordered(target, seed=tiny_llama.DRAFT_SEED + 1)
    assert not torch.equal(other["model.embed_tokens.weight"], draft["model.embed_tokens.weight"])
