"""End to end on real vLLM CPU: almost-right fixes that a fingerprint blind to where a value sits, or to its sign,
passes — each the reference fix plus one change to the drafter's reload, each named in the report with how its tensor
differs. A scenario of the draft_model family in the session's shared run (tests/helpers/shared_runs.py), one server
per variant: its drafter has an embedding of its own (EAGLE3's is the target's) and a checkpoint of its own,
builtin:tiny-llama-draft (the target in permuted coordinates: the same function in other tensors).

- `shard-swap`: the checkpoint's gate_proj and up_proj of the drafter's first layer loaded into each other's half of
  the merged gate_up_proj.
- `sign-flip`: the drafter's first down_proj loaded negated.
- `rows-reversed`: the drafter's embedding rows 128..255 loaded in reverse order. No request reads them (the prompts
  are ASCII), so AL holds.
- `wrong-checkpoint`: the drafter refilled from the target's checkpoint. The same function, so AL holds; every matrix
  holds the right values in other places.

Each leaves Σ|x| of every tensor as fresh, which is all a fingerprint compared before, and each expects `recover`, as
its author would. Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.diffs import insert_after
from tests.helpers.paths import REPO
from tests.helpers.procs import require_module, variant_of
from tests.helpers.scenario_texts import TINY_DRAFT_MODEL
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note, restores

require_module("vllm")

FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"
DOCSTRING_END = '+    is refilled from the draft checkpoint\'s embedding tensor instead.\n+    """\n'
DRAFT_WEIGHTS = "+        model_loader.get_all_weights(draft_model_config, draft_model),\n"
GATE, UP, DOWN = (f"model.layers.0.mlp.{name}.weight" for name in ("gate_proj", "up_proj", "down_proj"))
EMBEDDING = "model.embed_tokens.weight"
GATE_UP = "model.layers.0.mlp.gate_up_proj.weight"  # the drafter's parameter gate_proj and up_proj load into
CHANGES = {  # variant → lines wrapping the drafter's checkpoint tensors, right after the loader's docstring
    "shard-swap": f"""\
+    swapped = {{{GATE!r}: {UP!r}, {UP!r}: {GATE!r}}}
+    weights = ((swapped.get(n, n), t) for n, t in weights)  # almost right: gate and up in each other's half
""",
    "sign-flip": f"""\
+    weights = ((n, -t if n == {DOWN!r} else t) for n, t in weights)  # almost right: a down_proj negated
""",
    "rows-reversed": f"""\
+    weights = (  # almost right: embedding rows 128..255 in reverse order
+        (n, torch.cat([t[:128], t[128:256].flip(0), t[256:]]) if n == {EMBEDDING!r} else t) for n, t in weights
+    )
""",
}
TARGET_WEIGHTS = "+        model_loader.get_all_weights(vllm_config.model_config, draft_model),  # almost right\n"
NAMED = {  # variant → (the drafter tensor it changes, how it differs from fresh, the words the report says it in)
    "shard-swap": (GATE_UP, "rearranged", "same values in other places"),
    "sign-flip": ("model.layers.0.mlp.down_proj.weight", "signs", "signs changed"),
    "rows-reversed": (EMBEDDING, "rearranged", "same values in other places"),
}
VARIANTS = (*NAMED, "wrong-checkpoint")
SCENARIO = f"""\
name = "fooled-draft-model"
{TINY_DRAFT_MODEL}[workload]
prompts = "builtin:mixed"
max_tokens = 64
repeats = 2
warmup = 0
request_timeout_s = 120
[cycle]
count = 2
step_timeout_s = 120
"""


def write_scenario(folder: Path) -> list[Path]:
    """fooled-draft-model.toml: a variant per almost-right fix, each expected to recover."""
    fix = FIX.read_text()
    assert DOCSTRING_END in fix and fix.count(DRAFT_WEIGHTS) == 1
    texts = {name: insert_after(fix, DOCSTRING_END, lines) for name, lines in CHANGES.items()}
    texts["wrong-checkpoint"] = fix.replace(DRAFT_WEIGHTS, TARGET_WEIGHTS)  # one line for one: the hunk stays valid
    text = SCENARIO
    for name in VARIANTS:
        patch = folder / f"{name}.diff"
        patch.write_text(texts[name])
        text += f'[variants.{name}]\npatch = "{patch}"\n'
    text += "[expect]\n" + "".join(f'{name} = "recover"\n' for name in VARIANTS)
    scenario = folder / "fooled-draft-model.toml"
    scenario.write_text(text)
    return [scenario]


SCENARIOS = Scenarios("fooled", write_scenario, budget_s=1200)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def bullet(report: str, name: str) -> str:
    return next(line for line in report.splitlines() if line.startswith(f"- **{name}**: "))


def test_no_fix_that_fools_a_sum_of_magnitudes_passes(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "fail" and run["result"]["complete"] is True, outcome_note(run)
    assert run["leftovers"] == []
    assert {name: variant_of(run, name)["outcome"] for name in VARIANTS} == dict.fromkeys(VARIANTS, "degraded")


@pytest.mark.parametrize("name", list(NAMED))
def test_a_drafter_tensor_moved_or_negated_is_named_with_how(run: dict[str, Any], name: str) -> None:
    tensor, how, words = NAMED[name]
    v = variant_of(run, name)
    for fingerprint in restores(v):
        assert fingerprint["differ_how"] == {tensor: how} and fingerprint["moved"] == 0, fingerprint
    assert all(fingerprint["differ"] == 0 for fingerprint in restores(v, "target"))
    report = (run["dir"] / "report.md").read_text()
    assert re.search(
        rf"- draft: 1/\d+ tensors differ from fresh after reload_weights in cycles 1–2 .*— {re.escape(tensor)}:"
        rf" {words}$",
        report,
        re.MULTILINE,
    ), report
    line = bullet(report, name)
    assert "; the drafter's weights explain it (draft: 1/" in line and f" — {tensor}: {words})" in line, line


def test_rows_no_request_reads_keep_al_yet_are_named(run: dict[str, Any]) -> None:
    v = variant_of(run, "rows-reversed")
    assert [s["acceptance_length"] for s in v["stages"]] == [4.0, 4.0, 4.0]
    assert all(s["outputs_match_fresh"] for s in v["stages"][1:])


def expected_wrong_checkpoint() -> set[str]:
    """The drafter's parameters the target's checkpoint fills with other bytes: those of the checkpoint tensors that
    differ between the two (the norms, all ones, do not), named as vLLM's merged layers name them."""
    from specwake.worker.tiny_llama import draft_checkpoint, model_weights

    target, draft = model_weights(), draft_checkpoint()[1]
    merged = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj"}
    merged["up_proj"] = "gate_up_proj"
    differ = [name for name in target if not bool((target[name] == draft[name]).all())]
    return {re.sub(r"\.(\w+)\.weight$", lambda m: f".{merged.get(m[1], m[1])}.weight", name) for name in differ}


def test_a_drafter_refilled_from_the_target_checkpoint_holds_every_value_elsewhere(run: dict[str, Any]) -> None:
    v = variant_of(run, "wrong-checkpoint")
    assert [s["acceptance_length"] for s in v["stages"]] == [4.0, 4.0, 4.0]  # the target's function, as the drafter's
    expected = expected_wrong_checkpoint()
    assert EMBEDDING in expected and GATE_UP in expected and len(expected) > 3
    for fingerprint in restores(v):
        assert fingerprint["differ"] == len(expected) and set(fingerprint["differ_names"]) == expected
        assert fingerprint["differ_by_how"] == {"rearranged": len(expected)}
    line = bullet((run["dir"] / "report.md").read_text(), "wrong-checkpoint")
    assert f"the drafter's weights explain it (draft: {len(expected)}/" in line
    assert f" and {len(expected) - 3} more: same values in other places)" in line, line
