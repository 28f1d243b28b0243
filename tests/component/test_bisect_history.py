"""`specwake bisect` on a git history shaped like vLLM's (tests/helpers/vllm_history.py), up to the point where it
would start vLLM: the range it searches when `--good` is a release tag off main, what each commit's diff from BASE
carries into the overlay and what makes it skip, and which commit an installed build's version names. No engine is
started; tests/e2e/test_bisect.py runs the steps on the real one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specwake.errors import InputError
from specwake.run.bisect import Bisect, BisectOutcome, BisectRequest, _finish, find_base, render
from tests.helpers.fakeengine import run_cli
from tests.helpers.paths import REPO
from tests.helpers.vllm_history import commit, git, release, start, touch

SCENARIO = REPO / "scenarios" / "tiny-cpu.toml"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    repo = tmp_path_factory.mktemp("vllm")
    touch(repo, ["vllm/__init__.py", "vllm/envs.py", "vllm/logger.py"], "stock")
    fork = start(repo)
    tag = release(repo, "v0.33.0")
    touch(repo, ["vllm/envs.py"], "a fix")
    python = commit(repo, "[Bugfix] a fix, with its test, docs and CI")
    touch(repo, ["CMakeLists.txt", "csrc/ops.h", "vllm/logger.py"], "a kernel")
    kernel = commit(repo, "[Kernel] a kernel and its Python side")
    touch(repo, ["vllm/model_executor/layers/fused_moe/configs/E=8.json", "vllm/models/new.py"], "a model")
    touch(repo, ["requirements/test.txt", "use_existing_torch.py", ".github/workflows/pre-commit.yml"], "tooling")
    model = commit(repo, "[Model] a new model and its tuned config")
    git(repo, "config", "diff.noprefix", "true")  # a developer's own settings must not change the diffs bisect makes
    git(repo, "config", "diff.renames", "copies")
    return {"repo": repo, "fork": fork, "tag": tag, "python": python, "kernel": kernel, "model": model}


def make(history: dict[str, Any], good: str, bad: str = "main") -> Bisect:
    """The bisect as `specwake bisect` sets it up, BASE the release tag (as for the installed 0.33.0): nothing runs."""
    request = BisectRequest(SCENARIO, history["repo"], good, bad, history["repo"].parent / "out", base="v0.33.0")
    return Bisect(request, lambda event: None)


def diffed(diff: str) -> list[str]:
    return [line.split(" b/")[-1] for line in diff.splitlines() if line.startswith("diff --git ")]


def test_a_release_tag_on_its_branch_bisects_from_where_the_branch_left_main(history: dict[str, Any]) -> None:
    b = make(history, "v0.33.0")
    assert (b.good, b.good_given, b.bad) == (history["fork"], history["tag"], history["model"])
    assert [c.sha for c in b.commits] == [history["python"], history["kernel"], history["model"]]
    assert "--good v0.33.0 is not an ancestor of --bad main" in b.good_note
    assert f"merge base {history['fork'][:10]}" in b.good_note


def test_a_good_on_main_is_kept_and_nothing_is_said(history: dict[str, Any]) -> None:
    b = make(history, history["python"])
    assert (b.good, b.good_note) == (history["python"], "")
    assert [c.sha for c in b.commits] == [history["kernel"], history["model"]]


def test_tests_docs_and_ci_files_do_not_keep_a_python_change_off_the_overlay(history: dict[str, Any]) -> None:
    b = make(history, "v0.33.0")
    built, diff = b.changes(b.commits[0])
    assert built == []
    assert diffed(diff) == ["vllm/envs.py"] and "diff --git a/vllm/envs.py b/vllm/envs.py" in diff


def test_a_change_to_the_build_skips_the_commit_and_every_later_one(history: dict[str, Any]) -> None:
    b = make(history, "v0.33.0")
    kernel, model = (b.changes(c) for c in b.commits[1:])
    assert kernel[0] == ["CMakeLists.txt", "csrc/ops.h"]
    assert model[0] == ["CMakeLists.txt", "csrc/ops.h", "vllm/model_executor/layers/fused_moe/configs/E=8.json"]
    assert diffed(model[1]) == ["vllm/envs.py", "vllm/logger.py", "vllm/models/new.py"]  # the overlay: vllm/**.py only


def test_the_base_of_a_dev_build_is_the_commit_its_version_names(history: dict[str, Any]) -> None:
    assert find_base(history["repo"], f"0.33.1.dev1+g{history['python'][:9]}.d20260101.cu129") == history["python"]
    assert find_base(history["repo"], "0.33.0+cpu") == history["tag"]  # a release: its tag, wherever it sits


@pytest.mark.parametrize(
    ("version", "phrase"),
    [
        ("0.33.1.dev1+g0123abcd9", "built from commit 0123abcd9, which"),
        ("0.34.0", "has no tag v0.34.0; name the commit"),
    ],
)
def test_a_base_the_repo_does_not_have_is_bad_input(history: dict[str, Any], version: str, phrase: str) -> None:
    with pytest.raises(InputError, match=phrase):
        find_base(history["repo"], version)


def test_good_newer_than_bad_is_exit_2_before_anything_runs(history: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["bisect", str(SCENARIO), "--vllm-repo", str(history["repo"]), "--output", str(out)]
    proc = run_cli([*args, "--good", "main", "--bad", history["python"]], tmp_path / "cache")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--good main is newer than --bad {history['python']}" in proc.stderr
    assert not out.exists()


def test_the_merge_base_is_named_in_bisect_json_and_the_report(history: dict[str, Any]) -> None:
    b = make(history, "v0.33.0")
    outcome = _finish(b, BisectOutcome(b.root, [], 1, message="nothing"))
    data = json.loads((b.root / "bisect.json").read_text())
    assert (data["good"], data["good_given"]) == (history["fork"], history["tag"])
    assert render(outcome).startswith("--good v0.33.0 is not an ancestor of --bad main")
