"""vLLM's git history as `specwake bisect` reads it: git itself, which paths a commit's diff may change and still run on
an installed build (only what the build compiles or generates may not), the commit a dev or nightly wheel was built
from (its `+g<sha>`) or the tag of its release, and where a search starts when `--good` is on another branch.
"""

from __future__ import annotations

import re
import string
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from specwake.errors import InputError


def git(repo: Path, *args: str) -> str:
    """`git -C repo ARGS` → stdout; InputError with git's own message when it fails."""
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        message = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise InputError(f"--vllm-repo {repo}: git {' '.join(args[:2])}: {message[-1] if message else 'failed'}")
    return proc.stdout


def resolve(repo: Path, ref: str, flag: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except InputError:
        raise InputError(f"{flag} {ref}: not a commit of {repo}") from None


# What vLLM's build reads besides Python under vllm/: setup.py compiles csrc/ through CMakeLists.txt and cmake/ (and
# Rust from rust/), takes the install requirements from requirements/ and its metadata from pyproject.toml (setup.cfg,
# MANIFEST.in: what a setuptools build packs). Not here: tests/, docs/, examples/, benchmarks/, tools/, docker/,
# .github/, .buildkite/, and use_existing_torch.py (run by hand before a build; what it rewrites is listed here).
BUILD_FILES = frozenset({"setup.py", "pyproject.toml", "setup.cfg", "MANIFEST.in", "CMakeLists.txt"})
BUILD_FOLDERS = ("csrc/", "cmake/", "rust/")
# Requirement lists for vLLM's own tests, docs, linters and benchmarks (requirements/test/cuda.txt, rocm-test.txt,
# docs.txt, requirements-dev.txt of older trees): setup.py installs none of them.
NOT_INSTALLED = frozenset({"test", "docs", "lint", "dev", "bench"})
# Files under vllm/ that the build compiles or generates code from, or that it compiled: a .proto becomes _pb2
# modules, C, C++ and CUDA sources and libraries are machine code. Every other file there — Python, tuned .json
# configs, chat templates, static files — is installed as it is, and the overlay carries it as it carries a --patch.
BUILT_UNDER_VLLM = (".proto", ".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".so")


def build_input(path: str) -> bool:
    """Whether a change to `path` (relative to vLLM's root) changes what the installed build was compiled or
    generated from, which no overlay of installed files can stand in for."""
    if path.startswith("vllm/"):
        return path.endswith(BUILT_UNDER_VLLM)
    if path in BUILD_FILES or path.startswith(BUILD_FOLDERS):
        return True
    if path.startswith("requirements/") or re.fullmatch(r"requirements[^/]*\.(txt|in)", path):
        return not NOT_INSTALLED & set(re.split(r"[/._-]", path))
    return False


def foreign(paths: Sequence[str]) -> list[str]:
    """The paths that change the build itself (`build_input`), in their order."""
    return [p for p in paths if build_input(p)]


def built_from(version: str) -> str | None:
    """The commit a dev or nightly build names in its version's local part, setuptools-scm style: `+g<sha>`, maybe
    followed by `.d<date>` (built from a dirty tree) and a device suffix (`0.11.1rc2.dev5+gabcdef12.d20251001.cu129`
    → `abcdef12`); None for a release (`0.33.0`, `0.32.0+cpu`) or a version that is not PEP 440."""
    try:
        local = Version(version).local or ""
    except InvalidVersion:
        return None
    for part in local.split("."):  # packaging lower-cases the local part and turns - and _ into .
        if len(part) > 4 and part[0] == "g" and all(c in string.hexdigits for c in part[1:]):
            return part[1:]
    return None


def release_tags(version: str) -> list[str]:
    """The tags a release build's version may be found under: `v0.32.0` for `0.32.0` and for `0.32.0+cpu`."""
    try:
        public = Version(version).public
    except InvalidVersion:
        public = version
    return list(dict.fromkeys(f"{prefix}{v}" for v in (public, version) for prefix in ("v", "")))


@dataclass(frozen=True)
class Ref:
    name: str  # as given on the command line
    sha: str


def range_start(good: Ref, bad: Ref, merge_base: str | None) -> tuple[str, str]:
    """Where the search starts, and a sentence when that is not `--good` itself. `merge_base` is `git merge-base`'s
    answer (None: no common history). A `--good` that is not an ancestor of `--bad` — vLLM tags a release on its
    release branch, off main — is replaced by their merge base, the last commit the two share; InputError when
    there is nothing between them to search."""
    if good.sha == bad.sha:
        raise InputError(f"--good {good.name} and --bad {bad.name} are the same commit")
    if merge_base is None:
        raise InputError(f"--good {good.name} and --bad {bad.name} share no history")
    if merge_base == good.sha:
        return good.sha, ""
    if merge_base == bad.sha:
        raise InputError(
            f"--good {good.name} is newer than --bad {bad.name} (a descendant of it): --good is the older commit, also"
            " when searching for the commit that fixed a failure"
        )
    return merge_base, (
        f"--good {good.name} is not an ancestor of --bad {bad.name} (a tag on a release branch?): bisecting from their"
        f" merge base {merge_base[:10]} instead"
    )


UNDER_VLLM = "vllm/"  # the overlay's package, every file of it, as a --patch may change any
PLAIN = ("--no-renames", "--no-color", "--no-ext-diff")  # whatever the developer's git config says


def changes_the_build(built: Sequence[str]) -> str:
    """Why a commit is skipped: the files of its diff from BASE that change the build (the first four)."""
    shown = ", ".join(built[:4]) + (f" (+{len(built) - 4} more)" if len(built) > 4 else "")
    return f"its diff from BASE changes the installed build: {shown}"


def merge_base(repo: Path, a: str, b: str) -> str | None:
    """`git merge-base a b`: their best common ancestor, None when they share no history."""
    proc = subprocess.run(["git", "-C", str(repo), "merge-base", a, b], capture_output=True, text=True, check=False)
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def find_base(repo: Path, version: str) -> str:
    """The commit an installed vLLM `version` was built from, in `repo`: the one a dev or nightly build names
    (`built_from`), else its release's tag; InputError saying what to do when the repo has neither."""
    sha = built_from(version)
    if sha is not None:
        try:
            return resolve(repo, sha, "--base")
        except InputError:
            raise InputError(
                f"--base: the installed vLLM {version} was built from commit {sha}, which {repo} does not have; fetch"
                " it, or name the commit the build was made from with --base"
            ) from None
    for tag in release_tags(version):
        try:
            return resolve(repo, tag, "--base")
        except InputError:
            continue
    raise InputError(
        f"--base: the installed vLLM is {version} and {repo} has no tag {release_tags(version)[0]}; name the commit"
        " the installed build was made from with --base"
    )
