"""Values that depend on the vLLM release (specwake.prepare.releases): a table must answer every tested release once,
dev builds and patch releases belong to their series, and the scenario file reports a bad table as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.errors import ScenarioError
from specwake.prepare.releases import TESTED_RELEASES, ByRelease, is_tested
from specwake.prepare.scenario import load_scenario
from tests.helpers.scenario_texts import MINIMAL

SPLIT = {"<0.34": "collapse", ">=0.34": "recover"}


def test_a_table_answers_each_release_by_its_specifier() -> None:
    keyed = ByRelease.parse(SPLIT)
    assert keyed.varies
    assert [keyed.for_release(r) for r in ("0.32.0", "0.33.1", "0.34.0", "0.35.2")] == [
        "collapse",
        "collapse",
        "recover",
        "recover",
    ]
    assert keyed.for_release("0.34.0.dev12+g1234abc") == "recover"  # a dev build of 0.34 is 0.34's
    assert keyed.for_release("0.34.0rc1") == "recover"
    assert keyed.for_release(None) is None and keyed.for_release("unknown") is None
    assert keyed.per_tested_release() == [(r, "collapse" if r < "0.34" else "recover") for r in TESTED_RELEASES]
    assert keyed.to_json() == SPLIT


def test_a_plain_value_holds_for_every_release() -> None:
    plain = ByRelease.parse("recover")
    assert not plain.varies and plain.to_json() == "recover"
    assert plain.for_release(None) == plain.for_release("9.9.9") == "recover"


@pytest.mark.parametrize(
    ("table", "reason"),
    [
        ({}, "an empty table"),
        ({"newer": "x"}, "'newer' is not a release specifier"),
        ({"<0.33": "a", ">=0.34": "b"}, "no value for vLLM 0.33.0"),
        ({"<0.34": "a", ">=0.33": "b"}, "vLLM 0.33.0 matches both '<0.34' and '>=0.33'"),
    ],
)
def test_a_table_with_a_gap_an_overlap_or_a_bad_specifier_is_refused(table: dict[str, str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        ByRelease.parse(table)


def test_tested_means_a_tested_series() -> None:
    assert all(is_tested(r) for r in TESTED_RELEASES)
    assert is_tested("0.33.1") and is_tested("0.34.1.dev3")
    assert not is_tested("0.35.0") and not is_tested("0.31.0") and not is_tested("0.0.fake") and not is_tested(None)


def test_a_scenario_gives_an_expectation_per_release_and_names_the_key_of_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(MINIMAL + '[expect]\nbaseline = { "<0.34" = "collapse", ">=0.34" = "recover" }\n')
    (baseline,) = load_scenario(path).variants
    assert baseline.expected == "collapse on <0.34, recover on >=0.34"  # before the release is known: matches none
    assert baseline.for_release("0.33.0").expected == "collapse"
    assert baseline.for_release("0.34.0").expected == "recover"
    path.write_text(MINIMAL + '[expect]\nbaseline = { "<0.34" = "collapse", ">=0.34" = "recovered" }\n')
    with pytest.raises(ScenarioError, match=r"expect\.baseline: must be one of .* \(got 'recovered'\)"):
        load_scenario(path)
    path.write_text(MINIMAL + '[variants.baseline]\npatch = { "<0.34" = "a.diff" }\n')
    with pytest.raises(ScenarioError, match=r"variants\.baseline\.patch: no value for vLLM 0\.34\.0"):
        load_scenario(path)
