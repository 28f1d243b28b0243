"""The construction behind the builtin family checkpoints: token codes, the successor rule, and the matrices
that make a target's greedy text, and each drafter's guess of it, exact by construction.

Tokens are bytes (see tokenizer.py). The 95 printable ASCII characters get one-hot *codes* 0..94 in the first
hidden dimensions; every other token shares code 95. A target is a *bigram machine*: every attention and MLP
weight is 1e-3 noise, so its residual stream stays ≈ embed(x), and its lm_head turns code(x) into the
successor of x — the next printable character, cyclic ("Hello" → "efghijk…"); after any other token comes
' '. A drafter is built to compute the same successor, so every drafted token is accepted and a fresh
stage's acceptance length is exactly K + 1, whatever the prompt.

Every element of every tensor is non-zero (noise is added everywhere), so a parameter that reads all-zero,
or differs from its fresh checksum, was discarded and not restored.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch

from specwake.worker.tokenizer import VOCAB_SIZE

FIRST_PRINTABLE = 32  # ' '
PRINTABLE = 95  # ' ' .. '~'
OTHER = PRINTABLE  # the code shared by every non-printable token
CODES = PRINTABLE + 1
NOISE = 1e-3

CodeMap = Callable[[int], int]


def code_of(token: int) -> int:
    """The code a token's embedding carries."""
    offset = token - FIRST_PRINTABLE
    return offset if 0 <= offset < PRINTABLE else OTHER


def successor(code: int) -> int:
    """The code of the token the target emits after a token with this code."""
    return 0 if code == OTHER else (code + 1) % PRINTABLE


def same(code: int) -> int:
    return code


def token_of(code: int) -> int:
    """The token id of a printable code."""
    if not 0 <= code < PRINTABLE:
        raise ValueError(f"code {code} names no printable token")
    return FIRST_PRINTABLE + code


def next_token(token: int) -> int:
    """The target's greedy token after `token` (what tests and the drafters' construction check against)."""
    return token_of(successor(code_of(token)))


class Weights:
    """Seeded tensors for one checkpoint; the same name always gives the same bytes."""

    def __init__(self, name: str) -> None:
        self.gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))

    def noise(self, *shape: int, std: float = NOISE) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, dtype=torch.float32) * std

    def ones(self, *shape: int) -> torch.Tensor:
        """A norm weight: 1 plus noise (never exactly 1, never 0)."""
        return 1.0 + self.noise(*shape)

    def small(self, *shape: int, value: float) -> torch.Tensor:
        return value + self.noise(*shape, std=value * 1e-2)

    def embedding(self, hidden: int, scale: float = 1.0) -> torch.Tensor:
        """[vocab, hidden]: token x → scale · e_code(x), plus noise."""
        emb = self.noise(VOCAB_SIZE, hidden)
        for token in range(VOCAB_SIZE):
            emb[token, code_of(token)] += scale
        return emb

    def code_map(self, rows: int, cols: int, fn: CodeMap = successor, scale: float = 1.0) -> torch.Tensor:
        """[rows, cols]: e_c → scale · e_fn(c) for every code c, plus noise (a permutation on the code dims)."""
        matrix = self.noise(rows, cols)
        for code in range(CODES):
            matrix[fn(code), code] += scale
        return matrix

    def head(self, hidden: int, fn: CodeMap = successor) -> torch.Tensor:
        """[vocab, hidden] lm_head: a state carrying code c scores token_of(fn(c)) highest."""
        head = self.noise(VOCAB_SIZE, hidden)
        for code in range(CODES):
            target = fn(code)
            if target < PRINTABLE:  # `same` leaves OTHER unreadable: no drafter state carries it
                head[token_of(target), code] += 1.0
        return head

    def identity_half(self, hidden: int, first: bool) -> torch.Tensor:
        """[hidden, 2·hidden]: keep one half of a concatenated input (first or second), drop the other."""
        keep = torch.eye(hidden) + self.noise(hidden, hidden)
        drop = self.noise(hidden, hidden)
        return torch.cat([keep, drop] if first else [drop, keep], dim=1)

    def shift_mlp(self, prefix: str, hidden: int, intermediate: int) -> dict[str, torch.Tensor]:
        """A SiLU-gated MLP that adds e_successor(s) − e_s to a residual carrying e_s (s printable).

        After the RMSNorm before it, the residual reads √hidden · e_s; unit s of gate/up is tuned to it
        (gate 4, up 1), every other unit stays ≈ 0, and down turns unit s into the shift.
        """
        root = hidden**0.5
        gate, up, down = (
            self.noise(intermediate, hidden),
            self.noise(intermediate, hidden),
            self.noise(hidden, intermediate),
        )
        active = float(torch.nn.functional.silu(torch.tensor(4.0)))
        for s in range(PRINTABLE):
            gate[s, s] += 4.0 / root
            up[s, s] += 1.0 / root
            down[successor(s), s] += 1.0 / active
            down[s, s] -= 1.0 / active
        return {
            f"{prefix}.mlp.gate_proj.weight": gate,
            f"{prefix}.mlp.up_proj.weight": up,
            f"{prefix}.mlp.down_proj.weight": down,
        }
