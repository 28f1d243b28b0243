"""End to end on real vLLM CPU: the whole drafter-family matrix (scenarios/cpu/*.toml) in the session's shared run
(tests/helpers/shared_runs.py), each server started once. Every family runs with three vLLMs: stock (baseline), the
reference fix (patched) and the known-bad first fix (naive, tests/data/naive-draft-reload.diff).

Stock must collapse everywhere and the reference fix recover everywhere; the naive fix recovers draft_model,
EAGLE3 and MiMo but crashes the Gemma4 engine — the incomplete fix this matrix exists to catch before a GPU is spent.
The emulated discard follows both releases' L2 sleep: the shipped files' other variants run here only where an
assertion needs them (vLLM's --sleep-preserve-parameter-names 'draft.*' under 0.32/0.33's and 0.34's rules on the
Gemma4 family; the random-fill MiMo copy under 0.34's), to keep the shared run short.
Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from specwake.protocol import release_rules
from specwake.report.markdown import for_terminal
from specwake.run.server.groups import start_ticks
from tests.helpers.paths import REPO
from tests.helpers.procs import require_module
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

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
MATRIX = {"baseline", "patched"}  # of every family (and the naive fix, added)
PRESERVED = "cpu-gemma4-mtp"  # the family that keeps vLLM's workaround, under both rules: a drafter sharing the
PRESERVE = ("preserve", "preserve-0.34")  # target's embedding, a tied head, and plain attributes in the target


def family_scenarios() -> list[Path]:
    """The family matrix: scenarios/cpu/*.toml but the weight pushes and syncs (tests/e2e/test_push.py and
    tests/e2e/test_sync.py run those), as `make families` has them, and the DSpark family (Model Runner V2, whose
    steps run in Triton's interpreter: tests/e2e/test_dspark.py runs it, smaller) and the Qwen3.5 hybrid MTP family
    (the same, tests/e2e/test_qwen35.py)."""
    return sorted(
        p
        for p in CPU_SCENARIOS.glob("*.toml")
        if not p.name.startswith(("push-", "sync-", "dp-")) and p.name not in ("dspark.toml", "qwen-mtp.toml")
    )


def only_variants(text: str, keep: set[str]) -> str:
    """A scenario's text with every variant but those in `keep` taken out: its [variants.NAME] table and its line in
    [expect]."""
    variants = set(tomllib.loads(text)["variants"])
    lines, table = [], ""
    for line in text.splitlines(keepends=True):
        if line.startswith("["):
            table = line.strip()
        variant = re.fullmatch(r'\[variants\.("?)([^"\]]+)\1\]', table)
        if variant is not None and variant[2] not in keep:
            continue
        key = re.match(r'"?([^"=\s]+)"?\s*=', line) if table == "[expect]" else None
        if key is not None and key[1] in variants - keep:
            continue
        lines.append(line)
    kept = "".join(lines)
    assert set(tomllib.loads(kept)["variants"]) == variants & keep
    return kept


def copied(source: Path, folder: Path, name: str, keep: set[str], extra: str = "", cycle: str = "") -> Path:
    """The shipped scenario with only the variants in `keep`, its patch paths made absolute, `extra` appended and
    `cycle` keys added."""
    text = only_variants(source.read_text(), keep).replace('"../patches/', f'"{CPU_SCENARIOS.parent}/patches/')
    text = text.replace("[cycle]\n", f"[cycle]\n{cycle}") + extra
    # On Model Runner V2, as vLLM chooses on a GPU (the shared run asks V1 of every scenario that leaves it open), with
    # the shipped workload (2 requests of 8 tokens a stage): AL is K + 1 fresh from the first drafted token, and 1.00
    # after a cycle from the first as well. The copies once asked 16 tokens: a collapsed V2 stage took twice as long.
    text = re.sub(r"(?m)^\[server\]\n", '[server]\nmodel_runner = "v2"\n', text, count=1)
    copy = folder / name
    copy.write_text(text)
    return copy


def write_scenarios(folder: Path) -> list[Path]:
    """Every family with stock vLLM, the reference fix and the naive fix as a third variant (Gemma4 with vLLM's
    workaround under both rules too), and the MiMo family once more with a random discard by 0.34's rules."""
    naive = f'\n[variants.naive]\npatch = "{NAIVE}"\n'
    scenarios = []
    for path in family_scenarios():
        keep = MATRIX | (set(PRESERVE) if f'name = "{PRESERVED}"' in path.read_text() else set())
        scenarios.append(copied(path, folder, path.name, keep, extra=naive))
    mimo = (CPU_SCENARIOS / "mimo-mtp.toml").read_text().replace('name = "cpu-mimo-mtp"', f'name = "{RANDOM_FILL}"')
    (folder / "mimo-source.toml").write_text(mimo)
    # the MiMo family once more, its discard leaving random values, not zeros, and following vLLM 0.34's L2 sleep
    random = 'discard_fill = "random"\ndiscard_rules = "0.34"\n'
    scenarios.append(copied(folder / "mimo-source.toml", folder, "mimo-random.toml", MATRIX, cycle=random))
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
    for name, result in run["results"].items():
        wanted = MATRIX | ({"naive"} if name in FAMILIES else set()) | (set(PRESERVE) if name == PRESERVED else set())
        assert {v["name"] for v in result["variants"]} == wanted
    assert all(r["verdict"] == "pass" and r["complete"] for r in run["results"].values()), outcome_note(run)
    assert run["leftovers"] == []


def test_every_family_ran_on_model_runner_v2(run: dict[str, Any]) -> None:
    """The runner every GPU server runs: its workers say so, and so do the servers' logs."""
    for result in run["results"].values():
        for v in result["variants"]:
            assert v["model_runner"] == "v2", (result["scenario"]["name"], v["name"])
            assert "Using V2 Model Runner" in Path(v["log_path"]).read_text()


def test_the_servers_were_forked_warm_from_launchers_that_imported_vllm_once_and_are_gone(run: dict[str, Any]) -> None:
    """Every server of the matrix was forked from a warm launcher (specwake.run.server.warm): one per vLLM (stock,
    each overlay) and environment, so fewer launchers than servers, each forked from the base of its environment, so
    fewer bases than launchers; the ALs and outputs asserted here are theirs. No launcher or base outlives the run."""
    variants = [v for result in run["results"].values() for v in result["variants"]]
    assert {v["info"]["start"] for v in variants} == {"warm"}
    forked = [
        re.search(r"# warm start: forked from launcher pid (\d+)", Path(v["log_path"]).read_text()) for v in variants
    ]
    launchers = {int(match.group(1)) for match in forked if match is not None}
    assert all(forked) and 1 < len(launchers) < len(variants)
    bases = {int(m) for v in variants for m in re.findall(r"its base: pid (\d+)", Path(v["log_path"]).read_text())}
    assert 0 < len(bases) < len(launchers)  # launchers of one environment, stock or patched, share a base
    assert [pid for pid in launchers | bases if start_ticks(pid) is not None] == []


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


def discard_answers(v: dict[str, Any]) -> list[dict[str, Any]]:
    """Every worker's answer to the variant's first emulated discard."""
    return next(s for s in v["steps"] if s["name"] == "discard")["response"]["results"]


def fingerprint_at(v: dict[str, Any], point: str) -> dict[str, Any]:
    """The first rank's fingerprints at the first probe point so named."""
    return next(d for d in v["diagnostics"] if d["point"] == point)["fingerprints"][0]


@pytest.mark.parametrize("scenario", sorted(FAMILIES))
def test_the_discard_takes_every_kind_a_real_l2_sleep_takes(run: dict[str, Any], scenario: str) -> None:
    base = variant(run, scenario, "baseline")
    for answer in discard_answers(base):
        # no discard_rules in the file: the worker follows the rules of the vLLM it runs
        assert answer["rules"] == release_rules(base["vllm_version"]) and answer["preserve"] == []
        for role in ("target", "draft"):
            counts = answer[role]
            assert counts["parameter"] > 0 and counts["packed"] > 0 and counts["buffer_kept"] > 0, (role, counts)
        # the Gemma4 target's RMSNorm(has_weight=False) placeholders (never read): discarded as a GPU of the release
        # would, under 0.32/0.33's rules; 0.34's keep them (test_the_034_rules_keep_plain_attributes_...)
        placeholders = answer["target"]["attribute"] + answer["target"]["attribute_kept"]
        assert (placeholders > 0) == (scenario == "cpu-gemma4-mtp")
        assert answer["target"]["attribute"] == (placeholders if answer["rules"] == "0.33" else 0)
        assert answer["target"]["buffer"] == answer["draft"]["buffer"] == 0  # no family's buffer aliases a parameter


def table_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_combined_report_shows_the_matrix(run: dict[str, Any]) -> None:
    """The compact table that opens the report: a row per scenario × variant with its verdict (the shared run's other
    scenarios add theirs)."""
    report = (run["dir"] / "report.md").read_text()
    assert for_terminal(report) in run["proc"].stdout  # printed as plain text, for a CI log
    lines = report.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| scenario |"))
    table = itertools.takewhile(lambda line: line.startswith("|"), lines[first:])
    header, _rule, *rows = [table_cells(line) for line in table]
    verdicts = {(row[0], row[1]): row[header.index("verdict")] for row in rows}
    for scenario, naive in FAMILIES.items():
        cells = [verdicts[scenario, name] for name in ("baseline", "patched", "naive")]
        assert [cell.split()[0] for cell in cells] == ["collapse", "recover", naive], cells


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
    # by 0.34's rules, as the scenario asked: its stock vLLM still loses the drafter, and the fix still brings it back
    assert run["results"][RANDOM_FILL]["scenario"]["settings"]["cycle"]["discard_rules"] == "0.34"
    assert all(a["rules"] == "0.34" for v in (base, patched) for a in discard_answers(v))


@pytest.mark.parametrize("name", PRESERVE)
def test_vllms_workaround_keeps_the_drafters_own_weights_by_either_releases_rules(
    run: dict[str, Any], name: str
) -> None:
    """--sleep-preserve-parameter-names 'draft.*' on stock vLLM: the drafter's own parameters (and their packed CPU
    copies) survive the sleep, by 0.32/0.33's rules (saved and written back by name) and by 0.34's (left out of what
    is discarded); what the drafter shares with the target is the target's, lost and brought back by its reload."""
    v = variant(run, PRESERVED, name)
    assert v["outcome"] == "recover" and v["patch"] is None, v.get("error")
    assert all(s["acceptance_length"] == 4.0 for s in v["stages"])
    asked = run["results"][PRESERVED]["scenario"]["settings"]["variants"][name]
    assert asked["args"] == ["--sleep-preserve-parameter-names", "draft.*"]
    fresh, discarded = fingerprint_at(v, "after fresh"), fingerprint_at(v, "after discard")
    shared = fresh["draft"]["shared_with_target"]
    assert shared > 0
    for answer in discard_answers(v):
        assert answer["preserve"] == ["draft.*"]
        assert answer["rules"] == (asked["discard_rules"] or release_rules(v["vllm_version"]))
        draft = answer["draft"]
        assert draft["parameter"] == shared and draft["parameter_kept"] > 0  # only the target's tensors are lost
        assert draft["packed"] == 0 and draft["packed_kept"] > 0
    # read back before the wake: of the drafter, only the tensors it shares with the target differ from fresh
    assert discarded["draft"]["differ"] == shared and discarded["draft"]["packed_discarded"] == shared
    lost = discarded["target"]["differ_by_kind"]  # the target's parameters are all lost, its buffers all kept
    assert lost["parameter"] == fresh["target"]["kinds"]["parameter"] and lost["buffer"] == 0


def test_the_034_rules_keep_plain_attributes_the_033_rules_discard(run: dict[str, Any]) -> None:
    """The Gemma4 target holds plain tensor attributes (RMSNorm(has_weight=False) placeholders, memory of their own):
    0.32/0.33 drop the whole weights pool, 0.34 backs up everything that is not a discardable parameter's storage.
    Parameters and packed weights go alike under both."""
    (older,), (newer,) = (discard_answers(variant(run, PRESERVED, name)) for name in PRESERVE)
    assert (older["rules"], newer["rules"]) == ("0.33", "0.34")
    assert older["target"]["attribute"] > 0 and older["target"]["attribute_kept"] == 0
    assert newer["target"]["attribute"] == 0 and newer["target"]["attribute_kept"] == older["target"]["attribute"]
    for kind in ("parameter", "packed", "buffer", "parameter_kept", "packed_kept", "buffer_kept"):
        assert older["target"][kind] == newer["target"][kind], kind
    assert older["draft"] == newer["draft"]
