"""The builtin family checkpoints, offline: every registered model builds, shapes follow the config, no element is
exactly zero, and the bigram construction gives the successor rule through each family's own forward path
(attention ignored: its weights are 1e-3 noise). The real-vLLM matrix (test_e2e_families.py) measures AL."""

from __future__ import annotations

import pytest

from tests.helpers.procs import require_module

require_module("torch")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specwake.prepare.models import BUILTIN_MODELS  # noqa: E402
from specwake.worker import bigram  # noqa: E402
from specwake.worker.build import BUILDERS  # noqa: E402
from specwake.worker.tokenizer import VOCAB_SIZE  # noqa: E402

TOKENS = range(VOCAB_SIZE)


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[dict, dict[str, torch.Tensor]]]:
    return {name: build(name) for name, build in BUILDERS.items()}


def rms(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


def mlp(x: torch.Tensor, w: dict[str, torch.Tensor], prefix: str, act=F.silu) -> torch.Tensor:
    gate, up, down = (w[f"{prefix}.mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    return (act(x @ gate.T) * (x @ up.T)) @ down.T


def llama_states(w: dict[str, torch.Tensor], layers: int) -> torch.Tensor:
    """Residual stream after the target's layers, for every token at once (attention ≈ 0)."""
    h = w["model.embed_tokens.weight"].clone()
    for i in range(layers):
        p = f"model.layers.{i}"
        h = h + mlp(rms(h, w[f"{p}.post_attention_layernorm.weight"]), w, p)
    return h


def expected_next() -> torch.Tensor:
    return torch.tensor([bigram.next_token(t) for t in TOKENS])


def test_registry_and_builders_name_the_same_models(built) -> None:
    assert {m.name for m in BUILTIN_MODELS} == set(BUILDERS)
    for model in BUILTIN_MODELS:
        _, weights = built[model.name]
        assert sum(t.numel() for t in weights.values()) == model.parameters, model.name


@pytest.mark.parametrize("name", [n for n in BUILDERS if not n.startswith("tiny-llama")])
def test_no_element_is_exactly_zero(built, name: str) -> None:
    _, weights = built[name]
    zero = {k: int((t == 0).sum()) for k, t in weights.items() if bool((t == 0).any())}
    assert zero == {}


def test_builds_are_deterministic() -> None:
    for name in ("eagle3-llama-draft", "mtp-gemma4-assistant"):
        _, first = BUILDERS[name](name)
        _, again = BUILDERS[name](name)
        assert all(torch.equal(first[k], again[k]) for k in first)


@pytest.mark.parametrize("name", ["eagle3-llama", "mtp-mimo", "mtp-deepseek-v3"])
def test_llama_style_targets_say_the_successor_of_every_token(built, name: str) -> None:
    config, w = built[name]
    h = llama_states(w, config["num_hidden_layers"])
    logits = rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T
    assert torch.equal(logits.argmax(-1), expected_next())


def test_eagle3_drafter_proposes_the_next_three_tokens(built) -> None:
    _, target = built["eagle3-llama"]
    _, draft = built["eagle3-llama-draft"]
    aux = target["model.embed_tokens.weight"]  # first aux state of position t: the input of target layer 0
    state = torch.cat([aux, aux, aux], dim=-1) @ draft["fc.weight"].T  # carries the code of x_t+1
    want = expected_next()
    for _step in range(3):
        state = state + mlp(rms(state, draft["midlayer.post_attention_layernorm.weight"]), draft, "midlayer")
        want = torch.tensor([bigram.next_token(int(t)) for t in want])  # x_t+2, x_t+3, x_t+4
        proposed = (rms(state, draft["norm.weight"]) @ draft["lm_head.weight"].T).argmax(-1)
        assert torch.equal(proposed, want)


@pytest.mark.parametrize(
    ("name", "mtp", "proj", "token_first"),
    [
        ("mtp-mimo", "model.mtp_layers.0", "input_proj", False),
        ("mtp-deepseek-v3", "model.layers.2", "eh_proj", True),
    ],
)
def test_mtp_layers_predict_the_successor_of_their_input_token(built, name, mtp, proj, token_first) -> None:
    _, w = built[name]
    hidden = rms(llama_states(w, 2))
    embed = rms(w["model.embed_tokens.weight"])
    both = torch.cat([embed, hidden] if token_first else [hidden, embed], dim=-1)
    state = both @ w[f"{mtp}.{proj}.weight"].T
    state = state + mlp(rms(state, w[f"{mtp}.post_attention_layernorm.weight"]), w, mtp)
    head = w.get(f"{mtp}.shared_head.head.weight", w["lm_head.weight"])
    assert torch.equal((rms(state) @ head.T).argmax(-1), expected_next())


def test_gemma4_assistant_maps_the_target_embedding_to_the_successor(built) -> None:
    _, target = built["mtp-gemma4"]
    _, assistant = built["mtp-gemma4-assistant"]
    backbone = target["model.embed_tokens.weight"].shape[1]
    embedded = target["model.embed_tokens.weight"] * backbone**0.5  # vLLM's normalizer on the shared embedding
    hidden = torch.randn(VOCAB_SIZE, backbone) * 1e-2
    state = torch.cat([embedded, hidden], dim=-1) @ assistant["pre_projection.weight"].T
    logits = rms(state, assistant["model.norm.weight"]) @ assistant["model.embed_tokens.weight"].T  # tied head
    assert torch.equal(logits.argmax(-1), expected_next())


def gemma_rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """vLLM's GemmaRMSNorm (Qwen3.5's decoder, final and MTP norms): scales by 1 + weight."""
    return rms(x) * (1.0 + weight)


def qwen35_weights(built) -> tuple[dict, dict[str, torch.Tensor]]:
    config, weights = built["mtp-qwen35"]
    return config, {k: t.float() for k, t in weights.items()}


def qwen35_states(w: dict[str, torch.Tensor], layers: int) -> torch.Tensor:
    """Residual stream after the Qwen3.5 target's layers (linear and full attention ≈ 0: their weights are noise)."""
    h = w["model.embed_tokens.weight"].clone()
    for i in range(layers):
        p = f"model.layers.{i}"
        h = h + mlp(gemma_rms(h, w[f"{p}.post_attention_layernorm.weight"]), w, p)
    return h


def test_qwen35_is_a_hybrid_with_its_mtp_module_inside(built) -> None:
    config, w = built["mtp-qwen35"]
    assert set(config["layer_types"]) == {"linear_attention", "full_attention"}
    assert config["mtp_num_hidden_layers"] == 1
    for i, kind in enumerate(config["layer_types"]):
        mixer = "linear_attn.in_proj_qkv" if kind == "linear_attention" else "self_attn.q_proj"
        assert f"model.layers.{i}.{mixer}.weight" in w
    assert {k.split(".")[1] for k in w if k.startswith("mtp.")} == {
        "fc",
        "pre_fc_norm_embedding",
        "pre_fc_norm_hidden",
        "layers",
        "norm",
    }


def test_qwen35_target_says_the_successor_of_every_token(built) -> None:
    config, w = qwen35_weights(built)
    h = qwen35_states(w, config["num_hidden_layers"])
    logits = gemma_rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T
    assert torch.equal(logits.argmax(-1), expected_next())


def test_qwen35_mtp_module_predicts_the_successor_of_its_input_token(built) -> None:
    config, w = qwen35_weights(built)
    hidden = qwen35_states(w, config["num_hidden_layers"])
    embed = gemma_rms(w["model.embed_tokens.weight"], w["mtp.pre_fc_norm_embedding.weight"])
    both = torch.cat([embed, gemma_rms(hidden, w["mtp.pre_fc_norm_hidden.weight"])], dim=-1)
    state = both @ w["mtp.fc.weight"].T
    state = state + mlp(gemma_rms(state, w["mtp.layers.0.post_attention_layernorm.weight"]), w, "mtp.layers.0")
    logits = gemma_rms(state, w["mtp.norm.weight"]) @ w["lm_head.weight"].T
    assert torch.equal(logits.argmax(-1), expected_next())
