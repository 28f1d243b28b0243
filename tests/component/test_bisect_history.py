"""`specwake bisect` on a git history shaped like vLLM's (tests/helpers/vllm_history.py), up to the point where it
would start vLLM: the range it searches when `--good` is a release tag off main, what each commit's diff from BASE
carries into the overlay and what makes it skip, and which commit an installed build's version names. No engine is
started; tests/e2e/test_bisect.py runs the steps on the real one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from specwake.errors import InputError
from specwake.prepare.overlay import parse_patch
from specwake.report.bisect import render
from specwake.run.bisect.bisect import Bisect, BisectOutcome, BisectRequest, _finish
from specwake.run.bisect.vllm_git import find_base
from tests.helpers.fakeengine import BEHAVIOUR, BEHAVIOUR_TEXT, FakeEngine, run_cli, scenario_text
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
    assert model[0] == ["CMakeLists.txt", "csrc/ops.h"]
    assert b.last_runnable(len(b.commits) - 1) == 0  # the Python fix, the last commit before the kernel


def test_the_overlay_carries_package_data_as_a_patch_does(history: dict[str, Any]) -> None:
    """A tuned .json config under vllm/ is installed as it is: the overlay carries it (as `--patch` carries any file
    under vllm/), and it is no reason to skip a commit."""
    b = make(history, "v0.33.0")
    _, diff = b.changes(b.commits[2])
    config = "vllm/model_executor/layers/fused_moe/configs/E=8.json"
    assert diffed(diff) == ["vllm/envs.py", "vllm/logger.py", config, "vllm/models/new.py"]
    assert parse_patch(diff.encode(), "step.diff").patched_files == tuple(sorted(diffed(diff)))


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


# -- on the fake engine: what `git diff` alone decides is decided before anything runs ---------------------------


@pytest.fixture
def fake_history(engine: FakeEngine, tmp_path: Path) -> dict[str, Any]:
    """The fake engine's own vllm package as a vLLM checkout: stock (the drafter is not reloaded: collapse), the fix
    (recover), an unrelated Python change, then a kernel change (csrc/, CMakeLists.txt)."""
    repo = tmp_path / "vllm-repo"
    shutil.copytree(engine.package, repo / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    stock = start(repo)
    (repo / BEHAVIOUR).write_text(BEHAVIOUR_TEXT.replace("RELOADS_DRAFT = False", "RELOADS_DRAFT = True"))
    fix = commit(repo, "the fix")
    touch(repo, ["vllm/__init__.py"], "an unrelated comment")
    other = commit(repo, "an unrelated change")
    touch(repo, ["CMakeLists.txt", "csrc/ops.h"], "a kernel")
    kernel = commit(repo, "[Kernel] a kernel")
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine))
    return {"repo": repo, "scenario": scenario, "stock": stock, "fix": fix, "other": other, "kernel": kernel}


def fake_bisect(
    h: dict[str, Any], tmp_path: Path, good: str, bad: str, *extra: str, out: str = "out"
) -> tuple[Any, dict[str, Any]]:
    output = tmp_path / out
    args = ["bisect", str(h["scenario"]), "--vllm-repo", str(h["repo"]), "--base", h["stock"], "--output", str(output)]
    proc = run_cli([*args, "--good", h[good], "--bad", h[bad], *extra], tmp_path / "cache", 300)
    found = list(output.glob("*/bisect.json"))
    return proc, json.loads(found[0].read_text()) if found else {}


def test_a_bad_endpoint_that_changes_the_build_is_skipped_before_the_good_one_runs(
    engine: FakeEngine, tmp_path: Path, fake_history: dict[str, Any]
) -> None:
    h = fake_history
    proc, data = fake_bisect(h, tmp_path, "stock", "kernel")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = proc.stderr
    skip = events.index(f"skip {h['kernel'][:10]} [Kernel] a kernel: its diff from BASE changes the installed build")
    assert skip < events.index("good endpoint:"), events  # git diff alone decided it: said before any run
    assert f"--bad {h['kernel']} cannot be run: bisecting up to {h['other'][:10]}" in events
    assert "last runnable commit: " in events and "bad endpoint:" not in events
    assert data["result"]["word"] == "first fixed" and data["result"]["commit"]["sha"] == h["fix"]
    outcomes = {s["commit"]["sha"]: s["outcome"] for s in data["steps"]}
    assert outcomes == {h["kernel"]: None, h["stock"]: "collapse", h["other"]: "recover", h["fix"]: "recover"}
    assert data["runs"] == 3 == len(engine.servers())


def test_nothing_runs_when_no_commit_after_good_can_be_overlaid(
    engine: FakeEngine, tmp_path: Path, fake_history: dict[str, Any]
) -> None:
    proc, data = fake_bisect(fake_history, tmp_path, "other", "kernel")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert [c["sha"] for c in data["result"]["candidates"]] == [fake_history["kernel"]]
    assert "could not be run (skipped)" in proc.stdout and "[Kernel] a kernel" in proc.stdout
    assert engine.launched() == [] and data["runs"] == 0  # the good endpoint was not run for nothing


def test_a_later_bisect_reuses_what_an_earlier_one_measured_and_remeasure_runs_it_again(
    engine: FakeEngine, tmp_path: Path, fake_history: dict[str, Any]
) -> None:
    """The outcomes a bisect measured are kept in specwake's cache, keyed by the installed build, the diff overlaid
    and the scenario: a later bisect over some of the same commits starts no server for them and says so; another
    scenario (more cycles) or --remeasure runs them."""
    h = fake_history
    proc, first = fake_bisect(h, tmp_path, "stock", "other", out="first")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert first["runs"] == 3 == len(engine.servers()) and first["reused"] == []
    proc, again = fake_bisect(h, tmp_path, "stock", "fix", out="again")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(engine.servers()) == 3  # no server started: both endpoints were measured by the first bisect
    assert again["runs"] == 0 and again["reused"] == [h["stock"], h["fix"]]
    assert again["result"]["word"] == "first fixed" and again["result"]["commit"]["sha"] == h["fix"]
    steps = {s["commit"]["sha"]: s for s in again["steps"]}
    assert steps[h["fix"]]["reused"] == str(first_step_folder(tmp_path / "first", h["fix"]))
    assert (steps[h["stock"]]["outcome"], steps[h["fix"]]["outcome"]) == ("collapse", "recover")
    assert f"bad endpoint: {h['fix'][:10]} → recover (bad) reused: an earlier bisect measured" in proc.stderr
    assert "2 outcome(s) an earlier bisect measured, reused (--remeasure runs them again):" in proc.stdout
    assert "| recover (reused) |" in proc.stdout
    proc, cycles = fake_bisect(h, tmp_path, "stock", "fix", "--cycles", "2", out="cycles")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cycles["runs"] == 2 and cycles["reused"] == [] and len(engine.servers()) == 5
    proc, remeasured = fake_bisect(h, tmp_path, "stock", "fix", "--remeasure", out="remeasured")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert remeasured["runs"] == 2 and remeasured["reused"] == [] and len(engine.servers()) == 7
    assert "reused" not in proc.stderr


def first_step_folder(output: Path, sha: str) -> Path:
    (root,) = output.iterdir()
    return root / "steps" / sha[:10]


def test_a_commit_whose_server_never_starts_is_skipped_not_taken_as_evidence(
    engine: FakeEngine, tmp_path: Path
) -> None:
    """A step with nothing measured (outcome `error`: here the server exits before it is ready; in CI once a port
    lost to another process) says nothing of the bug: skipped, so the answer is the two commits it cannot tell apart
    (exit 3), not the unstartable commit as the first fixed."""
    repo = tmp_path / "vllm-repo"
    shutil.copytree(engine.package, repo / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    server = repo / "vllm" / "entrypoints" / "openai" / "api_server.py"
    working = server.read_text()
    stock = start(repo)
    server.write_text("raise SystemExit(1)\n")
    broken = commit(repo, "a server that cannot start")
    server.write_text(working)
    (repo / BEHAVIOUR).write_text(BEHAVIOUR_TEXT.replace("RELOADS_DRAFT = False", "RELOADS_DRAFT = True"))
    fix = commit(repo, "the fix, and the server back")
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine))
    h = {"repo": repo, "scenario": scenario, "stock": stock, "fix": fix}
    proc, data = fake_bisect(h, tmp_path, "stock", "fix")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    steps = {s["commit"]["sha"]: s for s in data["steps"]}
    assert steps[broken]["verdict"] == "skip" and steps[broken]["reason"].startswith("not tested: outcome error")
    assert (steps[stock]["outcome"], steps[fix]["outcome"]) == ("collapse", "recover")
    assert [c["sha"] for c in data["result"]["candidates"]] == [broken, fix]
