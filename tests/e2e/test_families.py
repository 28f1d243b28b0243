"""End to end on real vLLM CPU: the whole drafter-family matrix (scenarios/cpu/*.toml) in the session's shared run
(tests/helpers/shared_runs.py), each server started once. Every family runs with three vLLMs: stock (baseline), the
reference fix (patched) and the known-bad first fix (naive, tests/data/naive-draft-reload.diff).

Stock must collapse everywhere and the reference fix recover everywhere; the naive fix recovers draft_model,
EAGLE3 and MiMo but crashes the Gemma4 engine — the incomplete fix this matrix exists to catch before a GPU is spent.
Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from specwake.report.markdown import for_terminal
from tests.helpers.paths import REPO
from tests.helpers.procs import require_module
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

CPU_SCENARIOS = REPO / "scenarios" / "cpu"
NAIVE = REPO / "tests" / "data" / "naive-draft-reload.diff"
FAMILIES = {
    "cpu-draft-model": "recover",
    "cpu-eagle3": "recover",
    "cpu-mimo-mtp": "recover",
    "cpu-deepseek-v3-mtp": "recover",
    "cpu-gemma4-mtp": "crash",
}  # scenario → the naive fix's outcome
require_module("vllm")


RANDOM_FILL = "cpu-mimo-mtp-random"


def family_scenarios() -> list[Path]:
    """The family matrix: scenarios/cpu/*.toml but the weight pushes and syncs (tests/e2e/test_push.py and
    tests/e2e/test_sync.py run those), as `make families` has them."""
    return sorted(p for p in CPU_SCENARIOS.glob("*.toml") if not p.name.startswith(("push-", "sync-", "dp-")))


def copied(source: Path, folder: Path, name: str, extra: str = "", cycle: str = "") -> Path:
    """The shipped scenario with its patch path made absolute, `extra` appended and `cycle` keys added."""
    text = source.read_text().replace('"../patches/', f'"{CPU_SCENARIOS.parent}/patches/')
    text = text.replace("[cycle]\n", f"[cycle]\n{cycle}") + extra
    copy = folder / name
    copy.write_text(text)
    return copy


def write_scenarios(folder: Path) -> list[Path]:
    """Every family with the naive fix as a third variant, and the MiMo family once more with a random discard."""
    naive = f'\n[variants.naive]\npatch = "{NAIVE}"\n'
    scenarios = [copied(path, folder, path.name, extra=naive) for path in family_scenarios()]
    mimo = (CPU_SCENARIOS / "mimo-mtp.toml").read_text().replace('name = "cpu-mimo-mtp"', f'name = "{RANDOM_FILL}"')
    (folder / "mimo-source.toml").write_text(mimo)
    # the MiMo family once more, its discard leaving random values, not zeros
    scenarios.append(copied(folder / "mimo-source.toml", folder, "mimo-random.toml", cycle='discard_fill = "random"\n'))
    return scenarios


SCENARIOS = Scenarios("families", write_scenarios, budget_s=3600)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def variant(run: dict[str, Any], scenario: str, name: str) -> dict[str, Any]:
    return next(v for v in run["results"][scenario]["variants"] if v["name"] == name)


def test_the_matrix_covers_every_shipped_cpu_family(run: dict[str, Any]) -> None:
    assert sorted(run["results"]) == sorted([*FAMILIES, RANDOM_FILL])
    assert all(r["verdict"] == "pass" and r["complete"] for r in run["results"].values()), outcome_note(run)
    assert run["leftovers"] == []


@pytest.mark.parametrize("scenario", sorted(FAMILIES))
def test_stock_vllm_collapses_with_fresh_al_exactly_k_plus_1(run: dict[str, Any], scenario: str) -> None:
    base = variant(run, scenario, "baseline")
    fresh, *after = base["stages"]
    assert base["outcome"] == "collapse" and fresh["acceptance_length"] == 4.0  # K = 3, every draft accepted
    assert after and all(s["acceptance_length"] == 1.0 and s["outputs_match_fresh"] for s in after)


@pytest.mark.parametrize("scenario", sorted(FAMILIES))
def test_the_reference_fix_recovers_every_family(run: dict[str, Any], scenario: str) -> None:
    patched = variant(run, scenario, "patched")
    assert patched["outcome"] == "recover", patched.get("error")
    assert all(s["acceptance_length"] == 4.0 for s in patched["stages"])
    assert patched["overlay"] and patched["vllm_file"].startswith(patched["overlay"] + "/")
    restore = [d for d in patched["diagnostics"] if d["point"] == "after reload_weights"]
    assert restore and all(
        fp[role]["differ"] == 0 for d in restore for fp in d["fingerprints"] for role in ("target", "draft")
    )
    # every layer kind the family packs on CPU (QKV, merged and plain column, row, replicated, LM head, embedding)
    # is read back from its packed copy and compared, none left as an empty parameter nobody judges
    assert all(
        fp[role]["empty"] == 0 and fp[role]["unpacked"] > 0
        for d in restore
        for fp in d["fingerprints"]
        for role in ("target", "draft")
    )


@pytest.mark.parametrize(("scenario", "expected"), sorted(FAMILIES.items()))
def test_the_naive_fix_outcome_per_family(run: dict[str, Any], scenario: str, expected: str) -> None:
    naive = variant(run, scenario, "naive")
    assert naive["outcome"] == expected, naive.get("error")


def test_the_naive_fix_crash_on_gemma4_names_its_class_and_the_workers_error(run: dict[str, Any]) -> None:
    naive = variant(run, "cpu-gemma4-mtp", "naive")
    assert naive["crash_class"] in ("engine_dead", "step_failed")
    assert "AssertionError" in (naive["first_error"] or "")
    failed = [s for s in naive["steps"] if not s["ok"]]
    assert [s["name"] for s in failed] == ["reload_weights"]


def test_stock_leaves_the_drafter_unrestored_and_the_target_restored(run: dict[str, Any]) -> None:
    for scenario in FAMILIES:
        fps = [d for d in variant(run, scenario, "baseline")["diagnostics"] if d["point"] == "after reload_weights"]
        assert all(fp["target"]["differ"] == 0 and fp["draft"]["differ"] > 0 for d in fps for fp in d["fingerprints"])


def restore_points(v: dict[str, Any]) -> list[dict[str, Any]]:
    return [fp for d in v["diagnostics"] if d["point"] == "after reload_weights" for fp in d["fingerprints"]]


@pytest.mark.parametrize("scenario", sorted(FAMILIES))
def test_stock_and_the_reference_fix_keep_every_tensor_at_its_address(run: dict[str, Any], scenario: str) -> None:
    """Under CUDA graphs a moved tensor is read at its old, discarded address: neither may move one."""
    for name in ("baseline", "patched"):
        v = variant(run, scenario, name)
        fingerprints = restore_points(v)
        assert fingerprints and all(fp[role]["moved"] == 0 for fp in fingerprints for role in ("target", "draft"))
        assert v["findings"] == [], (name, v["findings"])


@pytest.mark.parametrize("scenario", sorted(FAMILIES))
def test_the_discard_takes_every_kind_a_real_l2_sleep_takes(run: dict[str, Any], scenario: str) -> None:
    discard = next(s for s in variant(run, scenario, "baseline")["steps"] if s["name"] == "discard")
    for answer in discard["response"]["results"]:
        for role in ("target", "draft"):
            counts = answer[role]
            assert counts["parameter"] > 0 and counts["packed"] > 0 and counts["buffer_kept"] > 0, (role, counts)
        # the Gemma4 target's RMSNorm(has_weight=False) placeholders: discarded, as a GPU would, and never read
        assert (answer["target"]["attribute"] > 0) == (scenario == "cpu-gemma4-mtp")


def table_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_combined_report_shows_the_matrix(run: dict[str, Any]) -> None:
    """A row per scenario, a column per variant name (the shared run's other scenarios add theirs)."""
    report = (run["dir"] / "report.md").read_text()
    assert for_terminal(report) in run["proc"].stdout  # printed as plain text, for a CI log
    lines = report.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| scenario |"))
    table = itertools.takewhile(lambda line: line.startswith("|"), lines[first:])
    header, _rule, *rows = [table_cells(line) for line in table]
    matrix = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    for scenario, naive in FAMILIES.items():
        outcomes = [matrix[scenario][name].split()[0] for name in ("baseline", "patched", "naive")]
        assert outcomes == ["collapse", "recover", naive], matrix[scenario]


def test_a_random_discard_is_still_caught_as_not_restored(run: dict[str, Any]) -> None:
    """Freed GPU memory is not cleared on wake: a drafter never reloaded holds noise, not zeros. Nothing reads as
    all-zero then, yet its checksums differ from fresh — and the fix still recovers."""
    base, patched = variant(run, RANDOM_FILL, "baseline"), variant(run, RANDOM_FILL, "patched")
    assert run["results"][RANDOM_FILL]["scenario"]["settings"]["cycle"]["discard_fill"] == "random"
    assert base["outcome"] == "collapse" and patched["outcome"] == "recover"
    discarded = next(d for d in base["diagnostics"] if d["point"] == "after discard")["fingerprints"][0]["draft"]
    assert discarded["all_zero"] == 0 and discarded["differ"] > 0
    restore = next(d for d in base["diagnostics"] if d["point"] == "after reload_weights")["fingerprints"][0]
    assert restore["draft"]["all_zero"] == 0 and restore["draft"]["differ"] > 0 and restore["target"]["differ"] == 0
