"""What a fingerprint reads of one tensor's values: a digest of its bits that changes whenever any element changes,
moves or flips its sign, and the sums that say which of those happened.

**The digest** is Σ w(p)·b(p) mod 2⁶⁴ over the tensor's elements in order, b(p) the raw bits of the element at
position p read as an integer of its own width (float32 → int32, bfloat16 → int16, float8 → uint8), and w(p) an odd
pseudo-random weight of the position: mix(j)·mix(b) for element j of block b (BLOCK elements a block; mix is
splitmix64's finalizer). It is integer arithmetic, exact: the same bytes in the same order give the same digest on
every call and device, wherever they are stored. A change of one element always changes it (an odd weight times a
change of less than 2⁶⁴ is never 0 mod 2⁶⁴); a permutation or a sign change leaves it equal only by a chance of the
order of 2⁻³⁰ or less. A permutation-invariant sum (Σ|x|, which specwake compared before) cannot see rows reversed,
gate and up halves swapped or a weight negated.

**The sums** only explain a difference the digest found: Σ of the sign-cleared bits (exact, in any order: the
multiset of magnitudes, as an integer), Σ|x| and Σx over the finite values in float64, and the count of NaN/inf. A
tensor whose magnitudes and signed sum are as fresh holds "the same values in other places"; one whose magnitudes are
as fresh but whose signed sum is not had "signs changed"; anything else holds "other values".

**The projection**, for a tensor a reload truly cannot reproduce bit for bit (named, with why, as *inexact*:
specwake.worker.tensors.inexact): Σ u(p)·x(p) in float64, u(p) a pseudo-random weight in [-1, 1) of the position (the
digest's mix(j)·mix(b), each made a float), with its scale √Σ(u·x)². Rounding every element by a few units in the last
place moves it by a few of those units times the scale; rows reversed, shards swapped or a matrix transposed move it by
about the scale itself. So it is compared within PROJECTION_UNITS units of the dtype's rounding (`difference(...,
exact=False)`; Σx likewise, and Σ|x| within one unit in the last place): it sees order, where Σ|x| and Σx cannot. A
digest of bits rounded to fewer mantissa bits would not do: with a unit of noise on every element, some of a million
elements always lie at a rounding boundary and flip.

Read READ elements at a time, so the extra memory stays a few such integer and float buffers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache

import torch

from specwake.protocol import REARRANGED, SIGNS, VALUES

BLOCK = 1 << 18  # element j of block b (position b·BLOCK + j) weighs mix(j)·mix(b ^ BLOCK_SALT)
BLOCK_SALT = 0x5BD1E995  # keeps block b's weight apart from element b's
# Elements read at a time, by device type: each needs a few temporaries of that many int64 or float64. On CPU a chunk
# the allocator reuses (not pages mapped anew for every one) costs a third of a 4 Mi-element one; on a GPU a large one
# spares kernel launches (benchmarks/bench_fingerprint.py). The digest is the same whatever the chunk.
READ = {"cpu": 1 << 18}
READ_DEFAULT = 1 << 22
REL_TOLERANCE = 1e-9  # float64 sums of the same values in another order agree far closer than this
# An inexact tensor's projection may move by this many units of its dtype's rounding times its scale (a unit on every
# element, at random, moves it by about one: 8 is far out in its tail); Σ|x| and Σx by one unit in the last place of
# every element (a kernel that rounds every element the same way).
PROJECTION_UNITS = 8
MASK64 = (1 << 64) - 1
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size → the integer view of its bits
NATIVE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # summed as they are; others via float64
SEVERITY = (REARRANGED, SIGNS, VALUES)  # a tensor whose parts differ in several ways differs in the last
MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # splitmix64's constants


def _signed(value: int) -> int:
    """An unsigned 64-bit value as the int64 that holds the same bits."""
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


def _shifted(values: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 values (torch's `>>` keeps the sign)."""
    return (values >> bits) & ((1 << (64 - bits)) - 1)


def mixed(values: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer of int64 `values` (wrapping arithmetic: the same integers on every device), made odd."""
    values = values + _signed(MIX[0])
    values = (values ^ _shifted(values, 30)) * _signed(MIX[1])
    values = (values ^ _shifted(values, 27)) * _signed(MIX[2])
    return (values ^ _shifted(values, 31)) | 1


@cache
def position_weights(device: torch.device) -> torch.Tensor:
    """The weight of each position in a block, mix(j) for j in 0..BLOCK-1, as int64 on `device` (kept: 2 MiB)."""
    return mixed(torch.arange(BLOCK, dtype=torch.int64, device=device))


def block_weights(first: int, count: int, device: torch.device) -> torch.Tensor:
    """The weights of blocks first..first+count-1."""
    return mixed(torch.arange(first, first + count, dtype=torch.int64, device=device) ^ BLOCK_SALT)


def weighted(bits: torch.Tensor, position: int) -> torch.Tensor:
    """Σ w(p)·bits over the elements of the 1-D `bits`, the first at position `position` (an int64 on its device,
    mod 2⁶⁴): a partial block, the whole blocks at once, a partial block."""
    weights = position_weights(bits.device)
    total = torch.zeros((), dtype=torch.int64, device=bits.device)
    head = min(bits.numel(), -position % BLOCK)
    if head:
        offset = position % BLOCK
        part = (bits[:head] * weights[offset : offset + head]).sum()
        total += part * block_weights(position // BLOCK, 1, bits.device)[0]
    rest, first = bits[head:], (position + head) // BLOCK
    whole = rest.numel() // BLOCK
    if whole:
        grid = rest[: whole * BLOCK].view(whole, BLOCK) * weights
        total += (grid.sum(dim=1) * block_weights(first, whole, bits.device)).sum()
    tail = rest[whole * BLOCK :]
    if tail.numel():
        total += (tail * weights[: tail.numel()]).sum() * block_weights(first + whole, 1, bits.device)[0]
    return total


@dataclass(frozen=True)
class Sums:
    """What a fingerprint reads of some values, in order: the position-weighted digest of their bits, the sum of their
    sign-cleared bits (both unsigned, mod 2⁶⁴), Σ|x| and Σx over the finite ones, how many are not finite, how many
    there are."""

    digest: int = 0
    magnitudes: int = 0
    total: float = 0.0
    signed: float = 0.0
    nonfinite: int = 0
    numel: int = 0
    projection: float | None = None  # Σ u·x, read only for an inexact tensor
    scale: float = 0.0  # √Σ (u·x)²
    rounding: float = 0.0  # the unit roundoff of its dtype (float64 sums of other dtypes: their own)

    @property
    def nonzero(self) -> bool:
        """Some element is not zero (a NaN or inf counts: it is not a zero)."""
        return self.total > 0 or self.nonfinite > 0

    @property
    def checksum(self) -> tuple[float | None, int, bool]:
        """(Σ|x|, or None when some element is not finite; the count of those; whether every element is zero)."""
        return (None if self.nonfinite else self.total), self.nonfinite, not self.nonzero

    @classmethod
    @torch.no_grad()
    def of(cls, blocks: Iterable[torch.Tensor], *, project: bool = False) -> Sums:
        """The sums of `blocks`' values, read as one sequence in order (blocks of any size, each read in pieces of at
        most READ elements); with `project`, their projection too (an inexact tensor's)."""
        reader = _Reader(project)
        for block in blocks:
            flat = block.detach().reshape(-1)
            for piece in flat.split(READ.get(flat.device.type, READ_DEFAULT)):
                reader.add(piece)
        return reader.sums()


class _Reader:
    """The running sums of one sequence, kept on its device until the end (one sync per piece: the finite check)."""

    def __init__(self, project: bool = False) -> None:
        self.position = 0
        self.project = project
        self.rounding = 0.0
        self.integers: torch.Tensor | None = None  # digest, magnitudes, nonfinite (int64)
        self.floats: torch.Tensor | None = None  # Σ|x|, Σx, Σ u·x, Σ (u·x)² (float64)

    def add(self, piece: torch.Tensor) -> None:
        """The next elements, 1-D."""
        if self.integers is None or self.floats is None:
            self.integers = torch.zeros(3, dtype=torch.int64, device=piece.device)
            self.floats = torch.zeros(4, dtype=torch.float64, device=piece.device)
        count, size = piece.numel(), piece.element_size()
        bits = piece.view(BITS[size]) if size in BITS else piece.to(torch.float64).view(torch.int64)
        self.integers[0] += weighted(bits, self.position)
        sign_cleared = (1 << (bits.element_size() * 8 - 1)) - 1
        self.integers[1] += (bits & sign_cleared).sum(dtype=torch.int64)
        values = piece if piece.dtype in NATIVE else piece.to(torch.float64)
        total, signed = values.abs().sum(dtype=torch.float64), values.sum(dtype=torch.float64)
        if not bool(torch.isfinite(total)):  # NaN or inf in this piece: sum the finite ones, count the others
            finite = torch.isfinite(values)
            self.integers[2] += count - finite.sum()
            values = torch.where(finite, values, torch.zeros((), dtype=values.dtype, device=values.device))
            total, signed = values.abs().sum(dtype=torch.float64), values.sum(dtype=torch.float64)
        self.floats[0] += total
        self.floats[1] += signed
        if self.project:
            weighed = values.to(torch.float64) * unit_weights(self.position, count, piece.device)
            self.floats[2] += weighed.sum()
            self.floats[3] += weighed.square().sum()
            self.rounding = max(self.rounding, unit_roundoff(piece.dtype))
        self.position += count

    def sums(self) -> Sums:
        if self.integers is None or self.floats is None:
            return Sums()
        digest, magnitudes, nonfinite = self.integers.tolist()
        total, signed, projection, square = self.floats.tolist()
        found = Sums(digest & MASK64, magnitudes & MASK64, float(total), float(signed), int(nonfinite), self.position)
        if not self.project:
            return found
        return replace(found, projection=float(projection), scale=math.sqrt(square), rounding=self.rounding)


def unit_weights(first: int, count: int, device: torch.device) -> torch.Tensor:
    """u(p) for positions first..first+count-1, in [-1, 1): the digest's weight mix(j)·mix(b) of each, its top 53 bits
    made a float (NaN and inf values are zeroed before they are weighed)."""
    positions = torch.arange(first, first + count, dtype=torch.int64, device=device)
    ints = position_weights(device)[positions % BLOCK] * mixed((positions // BLOCK) ^ BLOCK_SALT)
    return _shifted(ints, 11).to(torch.float64) * 2.0**-52 - 1.0


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the gap between 1 and the next value of `dtype` (0 for integers and booleans: exact)."""
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def _close(now: float, then: float, scale: float) -> bool:
    return abs(now - then) <= REL_TOLERANCE * max(1.0, scale)


def difference(now: Sums, then: Sums, *, exact: bool = True) -> str | None:
    """How `now` differs from `then` (REARRANGED, SIGNS, VALUES), None when it does not: by the digest, or, not `exact`
    (an inexact tensor, both read with their projection), by the projection, Σ|x| and Σx within rounding
    (PROJECTION_UNITS)."""
    projected = not exact and now.projection is not None and then.projection is not None
    if not projected and (now.digest, now.numel) == (then.digest, then.numel):
        return None
    scale = max(abs(now.total), abs(then.total))
    if now.numel != then.numel or now.nonfinite != then.nonfinite or not math.isfinite(scale):
        return VALUES
    if projected and now.projection is not None and then.projection is not None:  # (projected says so: for mypy)
        unit = max(now.rounding, then.rounding, REL_TOLERANCE)
        in_place = abs(now.projection - then.projection) <= PROJECTION_UNITS * unit * max(now.scale, then.scale)
        ulp = 2 * unit * scale  # every element one unit in its last place, all the same way
        same_total, same_signed = abs(now.total - then.total) <= ulp, abs(now.signed - then.signed) <= ulp
        if in_place and same_signed and same_total:
            return None
        if not same_total:
            return VALUES
        return REARRANGED if same_signed else SIGNS
    same_total, same_signed = _close(now.total, then.total, scale), _close(now.signed, then.signed, scale)
    if now.magnitudes != then.magnitudes or not same_total:
        return VALUES
    return REARRANGED if same_signed else SIGNS


def worst(kinds: Iterable[str | None]) -> str | None:
    """The kind of difference a tensor with several parts (its values, its packed copies) has: the most severe."""
    found = [kind for kind in kinds if kind is not None]
    return max(found, key=SEVERITY.index) if found else None
