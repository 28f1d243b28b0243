"""`make releases TREE=PATH` on a git checkout: which release a local vLLM tree is taken as (its version file, else its
newest release tag, as `git describe` finds it), and the one line with each failure named. The trees are small
(tests/unit/test_release_check.py's `small_release`), committed with the real git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.release_check import METRIC_NAMES, TreeError, check_flags, check_metrics, main_tree, tree_version
from tests.unit.test_release_check import small_release


def planted_checkout(root: Path, tag: str | None) -> Path:
    """A small vLLM tree committed to git, tagged `tag` and one commit past it (a branch after a release)."""
    tree = small_release(root)
    (tree / "vllm" / "__init__.py").write_text("")
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "release"], check=True)
    if tag:
        subprocess.run([*git, "tag", tag], check=True)
    (tree / "vllm" / "later.py").write_text("")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "a change after it"], check=True)
    return tree


def test_a_trees_version_is_its_version_file_else_its_newest_release_tag(tmp_path: Path) -> None:
    tree = planted_checkout(tmp_path / "tagged", "v9.8.7")
    assert tree_version(tree) == "9.8.7"
    built = planted_checkout(tmp_path / "built", "v9.8.7")  # a tree is read once a process: a built one of its own
    (built / "vllm" / "_version.py").write_text("__version__ = version = '9.9.0.dev3+gabc'\n")
    assert tree_version(built) == "9.9.0.dev3+gabc"
    with pytest.raises(TreeError, match=r"VERSION=0\.34\.0"):
        tree_version(planted_checkout(tmp_path / "untagged", None))


def test_a_tree_gets_one_line_and_each_failure_named_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = planted_checkout(tmp_path / "ok", "v9.9.9")
    assert main_tree(tree, None, (check_flags, check_metrics)) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"vLLM tree {tree} (as 9.9.9): scenario flags") and line.endswith("-> ok")
    broken = planted_checkout(tmp_path / "broken", "v9.9.9")
    (broken / "vllm" / "metrics.py").write_text("")
    assert main_tree(broken, None, (check_flags, check_metrics)) == 1
    out = capsys.readouterr().out.splitlines()
    assert "FAILED" in out[0] and out[1:] == [f"  failed: metric {m} is not in its source" for m in METRIC_NAMES]
