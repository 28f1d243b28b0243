"""The fingerprint's reading of one tensor (specwake.worker.digest): a digest that any moved, negated or changed element
alters and no copy of the same bytes does, and the sums that say how a tensor differs. Every expectation is made by
construction (a permuted copy must differ, a copy elsewhere must not); no digest value is written down."""

from __future__ import annotations

import pytest

from tests.helpers.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402, TID251 (torch is this test's subject, as in the workers)

from specwake.protocol import GONE, REARRANGED, SIGNS, VALUES  # noqa: E402
from specwake.worker import digest, tensors  # noqa: E402
from specwake.worker.digest import BLOCK, Sums, difference, worst  # noqa: E402
from specwake.worker.tensors import NAMES_KEPT, Reference, differs, fingerprint, inexact  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]


def weights(dtype: torch.dtype, rows: int = 64, cols: int = 24, seed: int = 0) -> torch.Tensor:
    """Random weights in `dtype`, none of them zero (so every move and sign change is one of values)."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, cols, generator=generator) * 0.5
    values = torch.where(values.abs() < 0.05, torch.full_like(values, 0.25), values)
    return values.to(dtype)


def reading(tensor: torch.Tensor) -> Sums:
    return Sums.of([tensor])


def elsewhere(tensor: torch.Tensor, offset: int = 3) -> torch.Tensor:
    """The same values copied into new storage at an odd element offset."""
    storage = torch.zeros(tensor.numel() + offset + 5, dtype=tensor.dtype)
    view = storage[offset : offset + tensor.numel()].view(tensor.shape)
    view.copy_(tensor)
    return view


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_same_bytes_anywhere_read_alike(dtype: torch.dtype) -> None:
    w = weights(dtype)
    copy = elsewhere(w)
    assert copy.storage_offset() == 3 and copy.data_ptr() != w.data_ptr()
    assert reading(copy) == reading(w) == reading(w.clone())
    assert difference(reading(copy), reading(w)) is None
    strided = w.t().contiguous().t()  # the same values in the same order, other strides
    assert not strided.is_contiguous() and reading(strided) == reading(w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_reversed_halves_swapped_and_signs_flipped_are_seen_and_named(dtype: torch.dtype) -> None:
    w = weights(dtype)
    fresh = reading(w)
    reversed_rows = w.clone()
    reversed_rows[16:48] = w[16:48].flip(0)
    swapped = torch.cat([w[32:], w[:32]])  # gate and up halves of a merged gate_up weight
    negated = (-w.float()).to(dtype)  # float8 has no neg of its own on CPU
    some_negated = w.clone()
    some_negated[5] = negated[5]
    scaled = (w.float() * 1.5).to(dtype)
    for changed, how in (
        (reversed_rows, REARRANGED),
        (swapped, REARRANGED),
        (w.t().contiguous(), REARRANGED),  # the same values read in another order
        (negated, SIGNS),
        (some_negated, SIGNS),
        (scaled, VALUES),
        (torch.zeros_like(w), VALUES),
    ):
        now = reading(changed)
        assert now.digest != fresh.digest
        assert difference(now, fresh) == how, how
    # Σ|x| alone, what a fingerprint compared before, sees none of the first five
    for changed in (reversed_rows, swapped, negated, some_negated):
        assert reading(changed).total == pytest.approx(fresh.total, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_every_single_element_changed_by_the_smallest_step_is_seen(dtype: torch.dtype) -> None:
    w = weights(dtype, rows=8, cols=8).reshape(-1)
    fresh = reading(w)
    bits = w.view(digest.BITS[w.element_size()])
    for i in range(w.numel()):
        nudged = bits.clone()
        nudged[i] += 1  # the next representable value: one unit in the last place
        now = reading(nudged.view(dtype))
        assert now.digest != fresh.digest and difference(now, fresh) == VALUES


def test_every_swap_of_two_different_values_is_seen() -> None:
    w = weights(torch.bfloat16, rows=6, cols=6).reshape(-1)
    fresh = reading(w)
    for i in range(w.numel()):
        for j in range(i + 1, w.numel()):
            if w[i] != w[j]:
                swapped = w.clone()
                swapped[i], swapped[j] = w[j], w[i]
                assert difference(reading(swapped), fresh) == REARRANGED, (i, j)


def test_blocks_of_any_size_read_as_one_sequence_across_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(3 * BLOCK + 1000, generator=torch.Generator().manual_seed(1))
    whole = reading(w)
    assert whole.numel == w.numel()
    for read in (BLOCK, 4 * BLOCK, 1000):  # a CPU's pieces, a GPU's, pieces out of step with the blocks
        monkeypatch.setitem(digest.READ, "cpu", read)
        for blocks in ([w], w.split(777), [w[:10], w[10 : BLOCK + 3], w[BLOCK + 3 :]]):
            found = Sums.of(blocks)
            assert (found.digest, found.magnitudes, found.numel) == (whole.digest, whole.magnitudes, whole.numel)
            assert found.total == pytest.approx(whole.total, rel=1e-12)  # float sums grouped otherwise: close
            assert difference(found, whole) is None
    moved = torch.cat([w[BLOCK : BLOCK + 500], w[:BLOCK], w[BLOCK + 500 :]])  # a run moved across a block boundary
    assert difference(reading(moved), whole) == REARRANGED
    blocks_swapped = torch.cat([w[BLOCK : 2 * BLOCK], w[:BLOCK], w[2 * BLOCK :]])  # whole blocks in another order
    assert difference(reading(blocks_swapped), whole) == REARRANGED


def test_every_weight_is_odd_and_no_two_positions_of_a_block_weigh_alike() -> None:
    found = digest.position_weights(torch.device("cpu"))
    assert found.dtype == torch.int64 and found.numel() == BLOCK and bool((found & 1).all())
    assert found.unique().numel() == BLOCK
    blocks = digest.block_weights(0, 64, torch.device("cpu"))
    assert bool((blocks & 1).all()) and blocks.unique().numel() == 64
    assert torch.equal(digest.block_weights(5, 1, torch.device("cpu")), blocks[5:6])


def test_nonfinite_values_are_counted_and_left_out_of_the_sums() -> None:
    w = torch.tensor([1.0, float("nan"), -2.0, float("inf")])
    found = reading(w)
    assert (found.nonfinite, found.total, found.signed, found.nonzero) == (2, 3.0, -1.0, True)
    assert found.checksum == (None, 2, False)
    assert difference(reading(torch.tensor([1.0, 0.0, -2.0, 0.0])), found) == VALUES
    assert difference(reading(w.clone()), found) is None  # NaN's bits are compared, not its value


def test_integer_and_bool_tensors_are_read_too() -> None:
    for tensor in (torch.tensor([1, -2, 3], dtype=torch.int8), torch.tensor([True, True, False])):
        found = reading(tensor)
        assert found.numel == 3 and difference(reading(tensor.flip(0)), found) == REARRANGED
    assert reading(torch.empty(0)) == Sums()


def rounded_otherwise(tensor: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """`tensor` with every element moved by -1, 0 or +1 unit in its last place, at random: what another kernel, split
    size or reduction order may leave."""
    bits = tensor.view(digest.BITS[tensor.element_size()])
    generator = torch.Generator().manual_seed(seed)
    steps = torch.randint(-1, 2, bits.shape, generator=generator).to(bits.dtype)
    return (bits + steps).view(tensor.dtype)


def projected(tensor: torch.Tensor) -> Sums:
    return Sums.of([tensor], project=True)


@pytest.mark.parametrize(("dtype", "rows", "cols"), [(torch.bfloat16, 4096, 512), (torch.float32, 512, 512)])
def test_an_inexact_tensors_projection_passes_rounding_and_sees_every_move(dtype: torch.dtype, rows: int, cols: int):
    """The issue's cases on a 4096×512 bfloat16 tensor: rows reversed, shards swapped, a square matrix transposed all
    read as unchanged by sums; the projection sees each, and passes a unit of rounding on every element."""
    w = weights(dtype, rows=rows, cols=cols)
    fresh = projected(w)
    noisy = rounded_otherwise(w)
    assert difference(reading(noisy), reading(w)) == VALUES  # bit for bit: not the same
    assert difference(projected(noisy), fresh, exact=False) is None  # by its projection: rounding passes
    moved = {
        "rows reversed": w.flip(0),
        "shards swapped": torch.cat([w[rows // 2 :], w[: rows // 2]]),
        "one shard's rows reversed": torch.cat([w[: rows // 2], w[rows // 2 :].flip(0)]),
    }
    if rows == cols:
        moved["transposed"] = w.t().contiguous()
    for why, tensor in moved.items():
        assert difference(projected(tensor), fresh, exact=False) == REARRANGED, why
        assert difference(projected(rounded_otherwise(tensor, seed=2)), fresh, exact=False) == REARRANGED, why
    assert difference(projected(-w), fresh, exact=False) == SIGNS
    assert difference(projected(w * 1.05), fresh, exact=False) == VALUES  # beyond a unit of rounding on every element
    assert fresh.projection is not None and reading(w).projection is None  # read only where asked


def test_a_tensor_of_several_parts_differs_in_its_worst_way() -> None:
    assert worst([None, REARRANGED, SIGNS]) == SIGNS and worst([VALUES, REARRANGED]) == VALUES
    assert worst([None, None]) is None
    w = weights(torch.float32)
    assert differs((reading(w),), (reading(w), reading(w.t()))) == VALUES  # a packed copy appeared
    assert differs((reading(w), reading(-w)), (reading(w), reading(w))) == SIGNS


class Layers(torch.nn.Module):
    def __init__(self, count: int = 3) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.layers = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(8, 4, generator=generator), requires_grad=False) for _ in range(count)
        )


def test_the_fingerprint_names_each_differing_tensor_with_how_it_differs() -> None:
    model = Layers(4)
    kept: Reference = {}
    fresh = fingerprint(model, keep=kept)
    assert fresh["version"] == 3 and "differ_how" not in fresh
    with torch.no_grad():
        model.layers[0].copy_(model.layers[0].flip(0))
        model.layers[1].neg_()
        model.layers[2].mul_(1.01)
    model.layers[3].data = torch.empty(0)
    after = fingerprint(model, reference=kept)
    assert after["differ"] == 4 and after["moved"] == 1
    assert after["differ_how"] == {"layers.0": REARRANGED, "layers.1": SIGNS, "layers.2": VALUES, "layers.3": GONE}
    assert after["differ_names"] == list(after["differ_how"])
    assert after["differ_by_how"] == {REARRANGED: 1, SIGNS: 1, VALUES: 1, GONE: 1} and after["inexact"] == 0


def test_the_fingerprint_keeps_the_first_names_and_counts_them_all() -> None:
    model = Layers(NAMES_KEPT + 5)
    kept: Reference = {}
    fingerprint(model, keep=kept)
    with torch.no_grad():
        for param in model.layers:
            param.neg_()
    after = fingerprint(model, reference=kept)
    assert after["differ"] == NAMES_KEPT + 5 and len(after["differ_names"]) == len(after["differ_how"]) == NAMES_KEPT
    assert after["differ_by_how"] == {SIGNS: NAMES_KEPT + 5}


def test_tensors_named_inexact_are_compared_by_their_projection() -> None:
    model = Layers(3)
    named = inexact(model, {"layers.[01]": "another kernel on reload"})
    assert named == frozenset({"layers.0", "layers.1"}) and inexact(model, {}) == frozenset()  # none by default
    kept: Reference = {}
    fingerprint(model, keep=kept, inexact=named)
    with torch.no_grad():
        model.layers[0].copy_(model.layers[0].flip(0))  # a rearrangement Σ|x| and Σx cannot see
        model.layers[1].copy_(rounded_otherwise(model.layers[1].detach()))  # rounding: passes where named
        model.layers[2].copy_(rounded_otherwise(model.layers[2].detach()))  # and only there
    after = fingerprint(model, reference=kept, inexact=named)
    assert after["differ_how"] == {"layers.0": REARRANGED, "layers.2": VALUES} and after["inexact"] == 2
    assert "by_sums" not in after


def test_on_an_accelerator_a_tensor_derived_after_loading_is_compared_bit_for_bit(monkeypatch: pytest.MonkeyPatch):
    """MLA's W_UK_T is registered by process_weights_after_loading, after vLLM built the model; a reload that derives
    it with its rows reversed is caught, on an accelerator as on CPU (issue: version 2 compared it by its sums)."""
    model = Layers(2)
    model.W_UK_T = torch.nn.Parameter(weights(torch.bfloat16, rows=64, cols=64), requires_grad=False)
    monkeypatch.setattr(tensors, "_on_accelerator", lambda _model: True)
    kept: Reference = {}
    fingerprint(model, keep=kept, inexact=inexact(model, {}))
    with torch.no_grad():
        model.W_UK_T.copy_(model.W_UK_T.flip(0))
    after = fingerprint(model, reference=kept, inexact=inexact(model, {}))
    assert after["differ_how"] == {"W_UK_T": REARRANGED} and after["inexact"] == 0
