"""Unit tests of specwake.judge.weights: reading the workers' fingerprints and discard answers as a run recorded
them."""

from __future__ import annotations

import re
from typing import Any

from specwake.judge.weights import moved, restored, worst_restore
from specwake.report.details import details
from specwake.report.weights import checker_line, discard_line, weights_line
from specwake.results import Diagnostic, StepResult
from tests.helpers.paths import REPO


def part(differ: int, compared: int = 7, **fields: Any) -> dict[str, Any]:
    return {"tensors": compared, "compared": compared, "differ": differ, **fields}


def at(cycle: int, *ranks: dict[str, Any], point: str = "after reload_weights") -> Diagnostic:
    """One restore point; each rank's drafter part given, its target matching fresh."""
    ranks_found = [{"target": part(0, 9), "draft": r} for r in ranks]
    return Diagnostic.from_dict({"cycle": cycle, "point": point, "fingerprints": ranks_found})


def test_every_cycle_is_read_worst_first_never_the_first_cycle_alone() -> None:
    diagnostics = [at(1, part(0)), at(2, part(7)), at(3, part(0))]
    assert weights_line(diagnostics, "draft") == (
        "draft: 7/7 tensors differ from fresh after reload_weights in cycle 2; 0/7 tensors differ from fresh in"
        " cycles 1, 3"
    )
    assert restored(diagnostics, "draft") is False and restored(diagnostics, "target") is True
    worst = worst_restore(diagnostics, "draft")
    assert worst is not None and worst.cycle == 2 and worst.not_restored == 7
    assert worst_restore(diagnostics, "target") is None


def test_cycles_with_one_reading_share_a_line_and_ranks_that_differ_are_named() -> None:
    same = [at(c, part(0)) for c in range(1, 21)]
    assert weights_line(same, "draft") == "draft: 0/7 tensors differ from fresh after reload_weights in cycles 1–20"
    split = [at(1, part(0), part(3))]
    assert weights_line(split, "draft") == (
        "draft: rank 0: 0/7 tensors differ from fresh, rank 1: 3/7 tensors differ from fresh after reload_weights"
        " in cycle 1"
    )


def test_kinds_other_than_parameters_are_named_when_they_differ() -> None:
    by_kind = {"parameter": 0, "buffer": 0, "attribute": 2}
    line = weights_line([at(1, part(2, 9, differ_by_kind=by_kind))], "draft")
    assert line == "draft: 2/9 tensors differ from fresh (2 tensor attributes) after reload_weights in cycle 1"


def named(how: dict[str, str], differ: int | None = None) -> dict[str, Any]:
    """A drafter part whose differing tensors are named with how they differ (a version 2 fingerprint)."""
    counts: dict[str, int] = {}
    for kind in how.values():
        counts[kind] = counts.get(kind, 0) + 1
    count = len(how) if differ is None else differ
    return part(count, 24, version=2, differ_names=list(how), differ_how=how, differ_by_how=counts)


def test_the_line_names_the_tensors_that_differ_and_how() -> None:
    swap = {"model.layers.0.mlp.gate_up_proj.weight": "rearranged"}
    assert weights_line([at(1, named(swap)), at(2, named(swap))], "draft") == (
        "draft: 1/24 tensors differ from fresh after reload_weights in cycles 1–2 — model.layers.0.mlp.gate_up_proj"
        ".weight: same values in other places"
    )
    flip = {"model.layers.0.mlp.down_proj.weight": "signs"}
    line = weights_line([at(1, part(0, 24)), at(2, named(flip))], "draft")
    assert line == (
        "draft: 1/24 tensors differ from fresh after reload_weights in cycle 2; 0/24 tensors differ from fresh in"
        " cycle 1 — model.layers.0.mlp.down_proj.weight: signs changed"
    )


def test_the_first_few_are_named_then_counted() -> None:
    five = {f"model.layers.{i}.weight": "values" for i in range(5)}
    assert weights_line([at(1, named(five))], "draft") == (
        "draft: 5/24 tensors differ from fresh after reload_weights in cycle 1 — model.layers.0.weight,"
        " model.layers.1.weight, model.layers.2.weight and 2 more: other values"
    )
    mixed = {"a": "signs", "b": "rearranged", "c": "values", "d": "gone"}
    assert weights_line([at(1, named(mixed, differ=30))], "draft") == (
        "draft: 30/24 tensors differ from fresh after reload_weights in cycle 1 — a (signs changed),"
        " b (same values in other places), c (other values) and 27 more"
    )
    old = part(2, 9, differ_names=["fc.weight", "norm.weight"])  # an older specwake: names, not how
    assert weights_line([at(1, old)], "draft") == (
        "draft: 2/9 tensors differ from fresh after reload_weights in cycle 1 — fc.weight, norm.weight"
    )


def test_old_results_without_comparisons_still_read() -> None:
    old = [
        Diagnostic.from_dict(
            {"cycle": 1, "point": "after reload_weights", "fingerprints": [{"draft": {"tensors": 7, "all_zero": 5}}]}
        )
    ]
    assert weights_line(old, "draft") == "draft: 5/7 parameters all-zero or on meta after reload_weights in cycle 1"
    assert restored(old, "draft") is None


def test_moved_tensors_per_model_with_the_rank_that_moved_most() -> None:
    moving = part(0, moved=2, moved_names=["a", "b"], moved_by_kind={"parameter": 1, "attribute": 1})
    found = moved([at(1, part(0)), at(2, part(0, moved=1, moved_names=["a"]), moving)])
    assert len(found) == 1 and (found[0].role, found[0].cycle, found[0].count) == ("draft", 2, 2)
    assert found[0].finding() == (
        "draft: 2 tensors in new storage after reload_weights in cycle 2 (1 parameters, 1 tensor attributes; a, b):"
        " a CUDA graph captured before the sleep reads the old memory"
    )


def discard_step(*answers: dict[str, Any]) -> StepResult:
    return StepResult(1, "discard", "POST", "/collective_rpc", 200, 0.1, True, response={"results": list(answers)})


def test_the_discard_line_counts_each_kind_per_model() -> None:
    answer = {
        "target": {"parameter": 15, "attribute": 4, "packed": 7, "buffer_kept": 10},
        "draft": {"parameter": 11, "attribute": 2, "packed": 0, "buffer_kept": 3},
    }
    assert discard_line([discard_step(answer)]) == (
        "discarded (emulated) — target: 15 parameters, 4 tensor attributes, 7 packed CPU weights; 10 buffers kept"
        " · draft: 11 parameters, 2 tensor attributes; 3 buffers kept"
    )
    assert discard_line([discard_step({"filled_tensors": 10})]) is None  # an answer from an older specwake
    assert discard_line([]) is None


def test_the_discard_line_names_the_rules_the_preserved_patterns_and_what_they_kept() -> None:
    answer = {
        "rules": "0.34",
        "preserve": ["draft.*"],
        "target": {"parameter": 15, "attribute": 0, "packed": 7, "buffer": 1, "attribute_kept": 2, "buffer_kept": 9},
        "draft": {"parameter": 1, "attribute": 0, "parameter_kept": 8, "packed_kept": 7, "buffer_kept": 7},
    }
    assert discard_line([discard_step(answer)]) == (
        "discarded (emulated, 0.34 rules, preserving draft.*) — target: 15 parameters, 0 tensor attributes,"
        " 7 packed CPU weights, 1 buffers; 2 tensor attributes, 9 buffers kept · draft: 1 parameters, 0 tensor"
        " attributes; 8 parameters, 7 packed CPU weights, 7 buffers kept"
    )


def test_the_rules_of_vllm_0_32_and_0_33_are_named_as_the_docs_name_them() -> None:
    """A discard by "0.33" reads `0.32/0.33 rules` in reports (and `check`), the one wording README.md and
    docs/how-it-works.md use; never `0.33 rules`, which reads as 0.33 alone."""
    answer = {"rules": "0.33", "target": {"parameter": 15, "attribute": 0, "packed": 0, "buffer_kept": 1}}
    line = discard_line([discard_step(answer)])
    assert line is not None and line.startswith("discarded (emulated, 0.32/0.33 rules) — ")
    docs = (REPO / "README.md").read_text() + (REPO / "docs" / "how-it-works.md").read_text()
    assert "0.32/0.33 rules" in docs and not re.search(r"[^/]0\.33(?:'s)? rules", docs)


def test_the_discard_line_is_a_bullet_of_the_diagnostics_like_its_neighbours() -> None:
    from tests.helpers.builders import variant

    answer = {"target": {"parameter": 15, "attribute": 0, "packed": 0, "buffer_kept": 9}}
    block = details(variant(steps=[discard_step(answer)], info={"timings": {"startup": 3.0}}))
    diagnostics = block[block.index("Diagnostics:") + 2 : block.index("</details>")]
    items = [line for line in diagnostics if line]
    assert items[1] == f"- {discard_line([discard_step(answer)])}"
    assert all(line.startswith("- ") for line in items), items


def synced(cycle: int, target_differ: int, checker: dict[str, Any]) -> Diagnostic:
    """The diagnostics after a weight sync: specwake's fingerprint of the target, and vLLM's /weight_checker."""
    target = part(target_differ, 9, differ_by_kind={"parameter": target_differ} if target_differ else {})
    entry = {"cycle": cycle, "point": "after weight sync", "fingerprints": [{"target": target, "draft": part(0)}]}
    return Diagnostic.from_dict(entry | {"weight_checker": checker})


FRESH_CHECKER = Diagnostic.from_dict(
    {"cycle": 0, "point": "after fresh", "weight_checker": {"offered": True, "parameters": 9}}
)


def test_vllms_weight_checker_is_read_beside_specwakes_fingerprint() -> None:
    same = {"match": True, "mismatches": 0, "names": [], "parameters": 9}
    line = checker_line([FRESH_CHECKER, synced(1, 0, same), synced(2, 0, same)])
    assert line is not None and line.endswith(
        "matches fresh after the sync in cycles 1–2 — specwake's fingerprint agrees"
    )
    assert "no drafter" in line  # what it covers is said
    two = {"match": False, "mismatches": 2, "names": ["tp0:a", "tp0:b"], "parameters": 9}
    line = checker_line([FRESH_CHECKER, synced(1, 2, two)])
    assert line is not None and "2/9 parameters differ from fresh in cycle 1 (tp0:a, tp0:b)" in line
    assert line.endswith("agrees")
    assert checker_line([FRESH_CHECKER, synced(1, 0, two)]).endswith("disagrees")  # type: ignore[union-attr]


def test_a_server_without_the_weight_checker_says_so_and_a_run_without_a_sync_says_nothing() -> None:
    absent = Diagnostic.from_dict(
        {"cycle": 0, "point": "after fresh", "weight_checker": {"offered": False, "status": 404}}
    )
    assert checker_line([absent]) == (
        "vLLM's /weight_checker (SHA-256 of the target's parameters; no drafter, no buffers): not offered by this"
        " server (vLLM 0.32 and later; HTTP 404)"
    )
    assert checker_line([at(1, part(0))]) is None
