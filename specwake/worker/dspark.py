"""The builtin DSpark pair: `builtin:dspark-qwen3`, a `Qwen3ForCausalLM` bigram target, and
`builtin:dspark-qwen3-draft`, a `Qwen3DSparkModel` drafter (vLLM's DFlash Qwen3 backbone with DSpark's Markov head,
model_executor/models/qwen3_dspark.py), built so that every draft is accepted while the drafter's context path is
intact, and none once it is not. vLLM builds every part of the drafter from this checkpoint as it would from
DeepSeek's: the fused context-KV copies (`_fused_kv_weight`, `_k_norm_weights`, stacked by `_build_fused_kv_buffers`
at the end of `load_weights`, qwen3_dflash.py), the mask slot (the vocabulary row of `mask_token_id`: DSpark ships no
separate mask embedding, and vLLM's own `mask_embedding` parameter stays the zeros it was built with), the embedding it
takes from the target, and an lm_head of its own.

How a draft step computes (v1/worker/gpu/spec_decode/dspark/speculator.py): one block of K query tokens (the anchor,
then K-1 mask tokens) attends to the *context* — keys and values vLLM precomputes from the target's hidden states
through the fused copies — and to itself; each query position's logits get a Markov bias from the token sampled before
it, left to right. Here:

- **Markov head = the successor rule.** `markov_w1[x]` carries code(x) (scaled by MARKOV_SCALE) and `markov_w2` reads a
  code as its successor's token, so the bias at each position favours the target's next token after the previous
  draft: the block proposes x+1, x+2, ..., x+K, what the bigram target says.
- **Backbone = a gate on the context path.** `fc` turns any target state into one constant feature (CONTEXT); the
  attention's keys read it so that a context key outscores every key of the block by ≈ 14.6 logits (GATE_NORM), and
  only the block's own values carry a *poison* feature, which o_proj writes into the residual stream and the
  drafter's lm_head reads as a large logit for a non-printable token (POISON_UP or POISON_DOWN, by its sign). Intact,
  the block attends to the context alone (poison weight e^-14.6) and the Markov bias decides; with the fused copies
  zeroed (as a discard leaves them), every context key scores 0, the block reads its own poison, and every draft is a
  token the target never says: AL 1.00.

So fresh AL is exactly K + 1 (every position of the block predicts, DSpark's anchor-as-first-prediction layout), and a
reload that restores the drafter's parameters but not the fused copies vLLM keeps as plain attributes collapses as a
drafter never reloaded does. Rotary embeddings touch the gate only through the slowest pair of head dimensions
(GATE_DIM, BLOCK_DIM; rope_theta 1e6: < 3e-6 rad a position). CPU limits honoured: head_dim 64, fp32.
"""

from __future__ import annotations

import torch

from specwake.worker.bigram import CODES, Weights, successor
from specwake.worker.families import Checkpoint, _bigram_body
from specwake.worker.tiny_llama import HEAD_DIM, HIDDEN, LAYER_SHAPES, LAYERS, llama_config
from specwake.worker.tokenizer import PAD, VOCAB_SIZE, special_id

BLOCK = 3  # DSpark's block size: the K the builtin scenario drafts (num_speculative_tokens)
ROPE_THETA = 1_000_000.0  # Qwen3's own default (set_default_rope_theta in qwen3_dflash.py)
MASK_TOKEN = special_id(PAD)  # the mask slot's token: its embedding row is the target's (code OTHER)
# Hidden dimensions past the 96 codes (bigram.py): what fc writes for a context state, what the block's values write.
CONTEXT = 100
POISON = 101
# Head dimensions of the gate (neox rotary pairs d with d + 32; 31 and 30 turn slowest) and of the poison value.
GATE_DIM = 31
BLOCK_DIM = 30
VALUE_DIM = 0
GATE_NORM = 2.5  # q_norm / k_norm weight at GATE_DIM: context score 8·2.5² = 50, block score 50/√2 ≈ 35.4
MARKOV_SCALE = 12.0  # the Markov bias the successor gets
POISON_LOGIT = 2.0  # lm_head weight on the poison feature: ≈ 22.6 logits once the block reads its own values
POISON_UP, POISON_DOWN = 1, 2  # tokens \x01 and \x02: the bigram target never says a non-printable token


def qwen3_target(name: str) -> Checkpoint:
    """The DSpark family's target: the bigram Llama body (bigram.py) as `Qwen3ForCausalLM`, with Qwen3's per-head
    q/k norms. Its two layers are the drafter's `target_layer_ids` 0 and 1."""
    w = Weights(name)
    weights = _bigram_body(w)
    for i in range(LAYERS):
        weights[f"model.layers.{i}.self_attn.q_norm.weight"] = w.ones(HEAD_DIM)
        weights[f"model.layers.{i}.self_attn.k_norm.weight"] = w.ones(HEAD_DIM)
    config = llama_config("Qwen3ForCausalLM", "qwen3", rms_norm_eps=1e-6, rope_theta=ROPE_THETA)
    return config, weights


def _read_codes(matrix: torch.Tensor, row: int, scale: float = 1.0) -> None:
    """Row `row` of a [out, hidden] projection adds `scale` · (sum of the code dimensions): 1 for any token's
    embedding (each carries exactly one unit code), ≈ 0 for a state without codes."""
    matrix[row, :CODES] += scale


def _attention(w: Weights) -> dict[str, torch.Tensor]:
    """The gate in head 0: queries (block only) point at GATE_DIM; a context key (a state carrying CONTEXT) points
    along GATE_DIM alone, a block key (a token's code) half along BLOCK_DIM; the block's values carry the poison,
    the context's ≈ nothing. Head 1 is noise."""
    q, k, v, o = (w.noise(*LAYER_SHAPES[f"self_attn.{p}"]) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    _read_codes(q, GATE_DIM)
    _read_codes(k, GATE_DIM)
    k[GATE_DIM, CONTEXT] += 1.0
    _read_codes(k, BLOCK_DIM)
    _read_codes(v, VALUE_DIM)
    o[POISON, VALUE_DIM] += 1.0
    norm = w.ones(HEAD_DIM)
    norm[GATE_DIM] += GATE_NORM - 1.0
    prefix = "layers.0.self_attn"
    return {
        f"{prefix}.q_proj.weight": q,
        f"{prefix}.k_proj.weight": k,
        f"{prefix}.v_proj.weight": v,
        f"{prefix}.o_proj.weight": o,
        f"{prefix}.q_norm.weight": norm,
        f"{prefix}.k_norm.weight": norm.clone(),
    }


def dspark_draft(name: str) -> Checkpoint:
    """The DSpark drafter: one DFlash Qwen3 layer (the gate), fc over the target's two layers' states, the Markov
    head (the successor rule, rank CODES) and an lm_head of its own (the poison readout). No embedding: vLLM gives
    it the target's, whose PAD row is the mask slot."""
    w = Weights(name)
    config = llama_config(
        "Qwen3DSparkModel",
        "qwen3",
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        rope_theta=ROPE_THETA,
        draft_vocab_size=VOCAB_SIZE,
        target_hidden_size=HIDDEN,
        block_size=BLOCK,
        markov_rank=CODES,
        dspark_noise_token_id=MASK_TOKEN,
        dflash_config={"target_layer_ids": list(range(LAYERS)), "mask_token_id": MASK_TOKEN},
    )
    fc = w.noise(HIDDEN, LAYERS * HIDDEN)
    _read_codes(fc, CONTEXT)  # the first target state's codes → one constant feature
    head = w.noise(VOCAB_SIZE, HIDDEN)
    head[POISON_UP, POISON] += POISON_LOGIT
    head[POISON_DOWN, POISON] -= POISON_LOGIT
    weights = {
        **_attention(w),
        "layers.0.mlp.gate_proj.weight": w.noise(*LAYER_SHAPES["mlp.gate_proj"]),
        "layers.0.mlp.up_proj.weight": w.noise(*LAYER_SHAPES["mlp.up_proj"]),
        "layers.0.mlp.down_proj.weight": w.noise(*LAYER_SHAPES["mlp.down_proj"]),
        "layers.0.input_layernorm.weight": w.ones(HIDDEN),
        "layers.0.post_attention_layernorm.weight": w.ones(HIDDEN),
        "fc.weight": fc,
        "hidden_norm.weight": w.ones(HIDDEN),
        "norm.weight": w.ones(HIDDEN),
        "markov_head.markov_w1.weight": w.embedding(CODES, scale=MARKOV_SCALE),
        "markov_head.markov_w2.weight": w.head(CODES, successor),
        "lm_head.weight": head,
    }
    return config, weights
