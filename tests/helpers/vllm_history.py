"""Git histories shaped like vLLM's own, for the bisect tests: a tree with vllm/ beside the files a vLLM checkout
holds (tests/, docs/, .buildkite/, csrc/, CMakeLists.txt, requirements/, …), commits that touch tests, docs and CI
files along with their Python change, and releases tagged on a release branch off main, as vLLM tags them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

# What a vLLM checkout holds besides vllm/; `start` writes each of them.
CHECKOUT = (
    "tests/conftest.py",
    "docs/README.md",
    "examples/offline_inference/basic.py",
    "benchmarks/benchmark_serving.py",
    ".github/workflows/pre-commit.yml",
    ".buildkite/test-pipeline.yaml",
    "csrc/ops.h",
    "cmake/utils.cmake",
    "CMakeLists.txt",
    "setup.py",
    "pyproject.toml",
    "requirements/common.txt",
    "requirements/test.txt",
    "use_existing_torch.py",
)
# What most of vLLM's commits touch besides their change to vllm/: none of it changes the installed build.
ALONGSIDE = ("tests/conftest.py", "docs/README.md", ".buildkite/test-pipeline.yaml")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def touch(repo: Path, paths: Iterable[str], line: str) -> None:
    """Append `line` (a comment in Python, YAML, CMake and Markdown alike) to each file, creating it if need be."""
    for path in paths:
        file = repo / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text((file.read_text() if file.exists() else "") + f"# {line}\n")


def commit(repo: Path, message: str, also: Iterable[str] = ALONGSIDE) -> str:
    """Commit what is in the tree after touching `also` (tests, docs and CI by default); the new commit's sha."""
    touch(repo, also, message)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def start(repo: Path) -> str:
    """Make `repo` (vllm/ already in it) a checkout on branch main whose first commit also holds CHECKOUT."""
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bisect@example.invalid")
    git(repo, "config", "user.name", "specwake tests")
    return commit(repo, "stock", CHECKOUT)


def release(repo: Path, tag: str) -> str:
    """Tag a release as vLLM does: on a branch `releases/<tag>` off the current commit of main, after a commit of its
    own there (release notes, the release pipeline); back on main afterwards. The tagged commit's sha."""
    git(repo, "checkout", "-q", "-b", f"releases/{tag}")
    sha = commit(repo, f"[Release] {tag}", ("docs/release-notes.md", ".buildkite/release-pipeline.yaml"))
    git(repo, "tag", tag)
    git(repo, "checkout", "-q", "main")
    return sha
