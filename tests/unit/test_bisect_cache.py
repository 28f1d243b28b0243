"""The key a `specwake bisect` step's outcome is kept under (specwake/run/bisect/bisect_cache.py): everything that
decides the outcome changes it — the scenario as the step runs it, the variant, the diff overlaid, the installed build —
and nothing else does; what is kept reads back, and an outcome that says nothing about the commit is never kept.
tests/component/test_bisect_history.py and tests/e2e/test_bisect.py show bisects reusing it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specwake.prepare.scenario import Overrides, Scenario, load_scenario
from specwake.run.bisect.bisect_cache import Measured, entry_file, keep, recall, step_key
from tests.helpers.paths import REPO

SCENARIOS = REPO / "scenarios"
TINY = (SCENARIOS / "tiny-cpu.toml").read_text().replace('"patches/', f'"{SCENARIOS}/patches/')  # copied elsewhere
DIFF = "diff --git a/vllm/envs.py b/vllm/envs.py\n--- a/vllm/envs.py\n+++ b/vllm/envs.py\n@@ -1 +1,2 @@\n x\n+# y\n"
BUILD = "0123456789abcdef01234567"  # engine.install_stamp of one installation


def scenario(tmp_path: Path, text: str = TINY, name: str = "s.toml", cycles: int | None = 1) -> Scenario:
    path = tmp_path / name
    path.write_text(text)
    return load_scenario(path, Overrides(cycles=cycles))


def key(s: Scenario, variant: str = "baseline", diff: str = DIFF, build: str = BUILD) -> str:
    return step_key(s, variant, diff, build)


def test_the_same_step_has_the_same_key_wherever_the_file_is_and_whatever_it_is_called(tmp_path: Path) -> None:
    here = scenario(tmp_path)
    elsewhere = scenario(tmp_path, TINY.replace('name = "tiny-cpu"', 'name = "renamed"'), "other.toml")
    assert elsewhere.name != here.name and elsewhere.file != here.file
    assert key(elsewhere) == key(here)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_tokens = 64", "max_tokens = 32"),
        ('prompts = "builtin:every-byte"', 'prompts = ["one prompt"]'),
        ("num_speculative_tokens = 3", "num_speculative_tokens = 2"),
        ('args = ["--seed", "0"', 'args = ["--seed", "1"'),
        ("tolerance = 0.05", "tolerance = 0.2"),
        ('dtype = "float32"', 'dtype = "bfloat16"'),
    ],
)
def test_a_changed_scenario_does_not_reuse(tmp_path: Path, old: str, new: str) -> None:
    assert TINY.count(old) == 1, old
    assert key(scenario(tmp_path, TINY.replace(old, new), "changed.toml")) != key(scenario(tmp_path))


def test_more_cycles_do_not_reuse(tmp_path: Path) -> None:
    assert key(scenario(tmp_path, cycles=2)) != key(scenario(tmp_path, cycles=1))


def test_a_different_vllm_build_diff_or_variant_does_not_reuse(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    assert len({key(s), key(s, build="fedcba9876543210fedcba98"), key(s, diff=DIFF + "+# z\n"), key(s, "patched")}) == 4
    assert key(s, diff="") != key(s)  # the installed vLLM itself (BASE) is a step of its own


def test_the_other_variants_and_the_expectations_do_not_decide_a_step(tmp_path: Path) -> None:
    """The step runs the chosen variant alone, without its patch, and its outcome is judged afterwards."""
    other = TINY.replace('patched = "recover"', 'patched = "collapse"').replace(
        'baseline = "collapse"', 'baseline = "any"'
    )
    other = other.replace("[variants.patched]", '[variants.patched]\nargs = ["--seed", "7"]')
    assert other.count("--seed") == 2
    assert key(scenario(tmp_path, other, "expects.toml")) == key(scenario(tmp_path))


def measured(outcome: str = "recover") -> Measured:
    return Measured(outcome, 2.5, (2.4,), 31.2, "a" * 40, "/results/x/steps/aaaaaaaaaa", "2026-01-01T00:00:00+00:00")


def test_a_kept_outcome_reads_back(tmp_path: Path) -> None:
    assert recall(tmp_path, "k") is None
    keep(tmp_path, "k", measured())
    assert recall(tmp_path, "k") == measured()


@pytest.mark.parametrize("outcome", ["error", "untested", "incomplete"])
def test_an_outcome_that_says_nothing_about_the_commit_is_never_kept(tmp_path: Path, outcome: str) -> None:
    keep(tmp_path, "k", measured(outcome))
    assert not entry_file(tmp_path, "k").exists()
    entry_file(tmp_path, "k").parent.mkdir()
    entry_file(tmp_path, "k").write_text(json.dumps({**dataclasses.asdict(measured()), "outcome": outcome}))
    assert recall(tmp_path, "k") is None  # nor read, should one be there


def test_an_entry_that_does_not_read_is_no_outcome(tmp_path: Path) -> None:
    keep(tmp_path, "k", measured())
    entry_file(tmp_path, "k").write_text('{"outcome": "recover"}')
    assert recall(tmp_path, "k") is None
    entry_file(tmp_path, "k").write_text("not json")
    assert recall(tmp_path, "k") is None
