"""Patched-vLLM overlay: apply a unified diff to a symlink mirror of an installed `vllm` package.

It lives in `<cache>/overlays/<key>/`: built in a temp dir, renamed into place, then reused.
What a diff touches, and why it does not apply, is asked of `git apply`; this module only judges the paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specwake.errors import EngineMissing, InfraError, PatchError

PACKAGE = "vllm"
STRIP = 1  # `git apply -p1`: paths in the diff look like a/vllm/... b/vllm/...
LAYOUT = "specwake.overlay/1"  # part of the key: bump when the overlay layout changes
MANIFEST = "specwake-overlay.json"
GIT_TIMEOUT_S = 120.0
STALE_TMP_S = 3600.0  # temp dirs older than this were left by a killed run
GIT_UNSET = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG", "GIT_CONFIG_COUNT", "GIT_CONFIG_PARAMETERS")

# A `---`/`+++` line pair: `git apply -p1` turns "/etc/passwd" into "etc/passwd", so absolute paths are
# looked for here; and when git finds no patch at all, a pair tells "header without hunks" from "not a diff".
_HEADERS = re.compile(rb'^--- "?([^\t\r\n]*).*\n\+\+\+ "?([^\t\r\n]*)', re.M)
_BINARY = re.compile(rb"^(?:GIT binary patch|Binary files .* differ)\r?$", re.M)
_CONTEXT_DIFF = re.compile(rb"^\*{15}\r?$", re.M)  # the hunk separator of `diff -c`
_SUMMARY = re.compile(r"^ (create|delete) (?:mode (\d+) )?(.*)$", re.M)  # `git apply --summary`
# A patch's header is the text before its first file; it may name the vLLM releases the patch was made for, as
# specwake's own patches do: "... in the directory that contains vllm/ (vLLM 0.32.0, 0.33.0)."
_FIRST_FILE = re.compile(rb"^(?:diff --git |--- )", re.M)
_HEADER_RELEASES = re.compile(rb"\(vLLM (\d+\.\d+\.\d+(?:, \d+\.\d+\.\d+)*)\)")


@dataclass(frozen=True)
class FilePatch:
    """One file of a diff; paths look like `vllm/...` (after -p1), None means /dev/null."""

    old_path: str | None
    new_path: str | None

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


@dataclass(frozen=True)
class PatchInfo:
    """What a diff touches, found without applying it."""

    path: Path
    sha256: str  # of the diff bytes
    files: tuple[FilePatch, ...]
    patched_files: tuple[str, ...]  # under vllm/, applied by the overlay
    skipped_files: tuple[str, ...]  # outside vllm/ (tests, docs), ignored
    releases: tuple[str, ...] | None = None  # the vLLM releases its header says it was made for; None: it names none


@dataclass(frozen=True)
class Overlay:
    """A built overlay; put `root` first on PYTHONPATH, `root/vllm` mirrors the package."""

    root: Path
    patched_files: tuple[str, ...]
    skipped_files: tuple[str, ...]
    key: str
    reused: bool


def inspect_patch(diff_path: Path) -> PatchInfo:
    """Validate a diff and list what it touches; PatchError names the file and the problem."""
    return parse_patch(_read(diff_path), str(diff_path))


def _read(diff_path: Path) -> bytes:
    try:
        return diff_path.read_bytes()
    except OSError as exc:
        raise PatchError(f"{diff_path}: cannot read patch: {exc.strerror or exc}") from exc


def parse_patch(data: bytes, name: str) -> PatchInfo:
    """`inspect_patch` on the diff's bytes (git reads them; nothing is applied): `name` only labels errors."""
    if not data.strip():
        raise PatchError(f"{name}: empty diff")
    if b"\0" in data:
        raise PatchError(f"{name}: binary patch (NUL bytes) is not supported")
    files = list_files(data, name)
    for header in _HEADERS.finditer(data):
        for raw in header.groups():
            if raw.startswith(b"/") and raw != b"/dev/null":
                raise PatchError(f"{name}: absolute path {_decode(raw)!r}")
    inside: list[str] = []
    outside: list[str] = []
    for fp in files:
        sides = [p for p in (fp.old_path, fp.new_path) if p is not None]
        for side in sides:
            check_path(side, name)
        in_pkg = [p.startswith(PACKAGE + "/") for p in sides]
        if any(in_pkg) and not all(in_pkg):
            raise PatchError(f"{name}: {fp.path}: moves a file across the {PACKAGE}/ boundary")
        (inside if all(in_pkg) else outside).append(fp.path)
    if not inside:
        raise PatchError(f"{name}: touches no file under {PACKAGE}/ (paths must be a/{PACKAGE}/...)")
    return PatchInfo(
        path=Path(name),
        sha256=hashlib.sha256(data).hexdigest(),
        files=tuple(files),
        patched_files=tuple(sorted(set(inside))),
        skipped_files=tuple(sorted(set(outside))),
        releases=header_releases(data),
    )


def header_releases(data: bytes) -> tuple[str, ...] | None:
    """The vLLM releases a diff's header (the text before its first file) names as "(vLLM 0.32.0, 0.33.0)", or None
    where it names none (a plain `git diff` has no header)."""
    first = _FIRST_FILE.search(data)
    found = _HEADER_RELEASES.search(data[: first.start() if first else len(data)])
    return tuple(v.strip() for v in found.group(1).decode().split(",")) if found else None


def check_path(path: str, name: str) -> None:
    """Refuse a path (as git reads it, after -p1) that could write outside the overlay's package."""
    parts = path.split("/")
    if path.startswith("/"):
        raise PatchError(f"{name}: absolute path {path!r}")
    if ".." in parts:
        raise PatchError(f"{name}: path {path!r} leaves the package ('..')")
    if ".git" in parts:
        raise PatchError(f"{name}: path {path!r} reaches into a .git folder")


def list_files(data: bytes, name: str) -> list[FilePatch]:
    """The files of a diff in diff order, as `git apply` reads them, run in an empty folder.

    `--numstat` names each file by its new path (its old one if deleted) and shows `-` for a binary patch;
    `-R --numstat` names it by its old path (its new one if created), last file first;
    `--summary` says which files are created or deleted, and with which mode.
    """
    with tempfile.TemporaryDirectory(prefix="specwake-diff-") as empty:
        forward = numstat(git_reads(["--numstat", "-z"], data, Path(empty), name))
        binary = [path for path, is_binary in forward if is_binary]
        if binary:
            raise PatchError(f"{name}: {binary[0]}: binary patch is not supported")
        backward = numstat(git_reads(["-R", "--numstat", "-z"], data, Path(empty), name))
        events = _SUMMARY.findall(_decode(git_reads(["--summary"], data, Path(empty), name)))
    files = []
    for (new, _), (old, _) in zip(forward, reversed(backward), strict=True):
        fp = FilePatch(old, new)
        if events and events[0][2] == new:  # this file is created or deleted
            kind, mode, _ = events.pop(0)
            if mode == "120000":
                raise PatchError(f"{name}: {fp.path}: symlinks in a patch are not supported")
            fp = FilePatch(None, new) if kind == "create" else FilePatch(old, None)
        files.append(fp)
    return files


def numstat(out: bytes) -> list[tuple[str, bool]]:
    """(path, is binary) of each `added<TAB>deleted<TAB>path<NUL>` record of `git apply --numstat -z`."""
    records = [record.split(b"\t", 2) for record in out.split(b"\0") if record]
    return [(_decode(path), added == b"-") for added, _, path in records]


def _decode(path: bytes) -> str:
    return path.decode("utf-8", "surrogateescape")


def git_reads(args: list[str], data: bytes, cwd: Path, name: str) -> bytes:
    """stdout of a `git apply ARGS` that only reads the diff; else a one-line PatchError saying why git refused.

    When git finds no patch at all ("No valid patches in input"), the text tells which kind of non-diff it is.
    """
    proc = run_git_apply(args, data, cwd, name)
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode == 0:
        return proc.stdout
    if "binary patch" in stderr or _BINARY.search(data):
        raise PatchError(f"{name}: binary patch is not supported")
    if "No valid patches" in stderr and _CONTEXT_DIFF.search(data):
        raise PatchError(f"{name}: context diff; a unified diff is needed")
    if "No valid patches" in stderr and _HEADERS.search(data):
        raise PatchError(f"{name}: file header without hunks")
    if "No valid patches" in stderr:
        raise PatchError(f"{name}: not a unified diff (no ---/+++ file headers)")
    orphan = re.search(r"patch fragment without header at line (\d+)", stderr)
    if orphan:
        raise PatchError(f"{name}: hunk at line {orphan.group(1)} comes before any file header")
    corrupt = re.search(r"corrupt patch at line (\d+)", stderr)
    if corrupt:
        raise PatchError(f"{name}: hunk is truncated or corrupt (diff line {corrupt.group(1)})")
    raise PatchError(describe_failure(name, stderr))


def overlay_key(diff_sha256: str, vllm_version: str, package_dir: Path) -> str:
    """Key of an overlay: sha256 of (layout, diff, vLLM version, package path), 20 hex digits."""
    fields = [LAYOUT, diff_sha256, vllm_version, str(package_dir)]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:20]


def build_overlay(diff_path: Path, package_dir: Path, vllm_version: str, cache: Path) -> Overlay:
    """Return the overlay of `package_dir` patched by `diff_path`, building it unless it exists."""
    data = _read(diff_path)
    package = package_dir.resolve()
    if not (package / "__init__.py").is_file():
        raise EngineMissing(f"{package_dir}: not an installed {PACKAGE} package (no __init__.py)")
    key = overlay_key(hashlib.sha256(data).hexdigest(), vllm_version, package)
    overlays = cache / "overlays"
    dest = overlays / key
    if (dest / MANIFEST).is_file():  # the key covers the diff's bytes: reuse it as its manifest says, no git run
        manifest = json.loads((dest / MANIFEST).read_text())
        return Overlay(dest, tuple(manifest["patched_files"]), tuple(manifest["skipped_files"]), key, True)
    try:
        overlays.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(overlays, STALE_TMP_S)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=overlays))
    except OSError as exc:
        raise InfraError(f"cannot create overlay folder in {overlays}: {exc}") from exc
    try:
        info = parse_patch(data, str(diff_path))
        mirror_package(package, tmp / PACKAGE)
        materialize(tmp, info)
        try:
            apply_diff(tmp, data, info)
        except PatchError as exc:  # what a contributor must rebase onto
            raise PatchError(f"{exc} (tried against vLLM {vllm_version} at {package})") from None
        manifest = {
            "layout": LAYOUT,
            "diff": str(diff_path),
            "diff_sha256": info.sha256,
            "vllm_version": vllm_version,
            "package_dir": str(package),
            "patched_files": list(info.patched_files),
            "skipped_files": list(info.skipped_files),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        won = publish(tmp, dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InfraError(f"cannot build overlay {dest}: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Overlay(dest, info.patched_files, info.skipped_files, key, reused=not won)


def mirror_package(package: Path, target: Path) -> int:
    """Mirror `package` at `target`: real directories, absolute symlinks for everything else."""
    os.mkdir(target)
    links = 0
    with os.scandir(package) as entries:
        for entry in entries:
            dst = os.path.join(target, entry.name)
            if entry.is_dir(follow_symlinks=False):
                links += mirror_package(Path(entry.path), Path(dst))
            else:
                os.symlink(entry.path, dst)
                links += 1
    return links


def materialize(root: Path, info: PatchInfo) -> None:
    """Replace the symlinks the diff will modify by real copies; drop their cached bytecode."""
    for fp in info.files:
        if fp.old_path is None or fp.path not in info.patched_files:
            continue
        link = root / fp.old_path
        if not link.is_symlink():
            continue  # missing: `git apply` reports it
        src = link.resolve()
        link.unlink()
        shutil.copy2(src, link)
        for pyc in (link.parent / "__pycache__").glob(f"{link.stem}.*.pyc"):
            pyc.unlink()


def run_git_apply(args: list[str], data: bytes, cwd: Path, name: str) -> subprocess.CompletedProcess[bytes]:
    """`git apply -p1 ARGS -` fed the diff `data`, run in `cwd` (which must not be in a repository)."""
    git = shutil.which("git")
    if git is None:
        raise InfraError("git is not installed; it is needed to apply patches")
    # No system/global config, English messages, no repository found above `cwd` (the cache may be in a checkout).
    env = {var: value for var, value in os.environ.items() if var not in GIT_UNSET}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    env["GIT_CEILING_DIRECTORIES"] = str(cwd.resolve().parent)
    argv = [git, "apply", f"-p{STRIP}", *args, "-"]
    try:
        return subprocess.run(argv, input=data, cwd=cwd, env=env, capture_output=True, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"git apply on {name} took over {GIT_TIMEOUT_S:.0f} s") from exc


def apply_diff(root: Path, data: bytes, info: PatchInfo) -> None:
    """Apply the diff's vllm/ files with cwd = `root`; raise PatchError naming the first failure.

    `--reject` makes git also number the failing hunk; a partly applied overlay is discarded by the caller.
    """
    args = [f"--include={PACKAGE}/*", "--whitespace=nowarn", "--reject"]
    proc = run_git_apply(args, data, root, str(info.path))
    if proc.returncode != 0:
        raise PatchError(describe_failure(str(info.path), proc.stderr.decode("utf-8", "replace")))


def describe_failure(name: str, stderr: str) -> str:
    """One line naming the diff, the target file and the failing hunk from git's stderr.

    git checks, then writes, files in diff order, so its first "patch failed: FILE:LINE" and its first
    "Rejected hunk #N." (printed by `--reject`) are the same hunk.
    """
    failed = re.search(r"^error: patch failed: (.+):(\d+)$", stderr, re.M)
    if failed:
        number = re.search(r"^Rejected hunk #(\d+)\.$", stderr, re.M)
        hunk = f"hunk #{number.group(1)}" if number else "hunk"
        return f"{name}: {failed.group(1)}: {hunk} at line {failed.group(2)} does not apply"
    about_file = re.search(r"^error: (.+?): (.+)$", stderr, re.M)
    if about_file:
        return f"{name}: {about_file.group(1)}: {about_file.group(2)}"
    detail = stderr.strip().splitlines()[0].removeprefix("error: ") if stderr.strip() else "git apply failed"
    return f"{name}: {detail}"


def publish(tmp: Path, dest: Path) -> bool:
    """Rename `tmp` to `dest`; False (and `tmp` removed) when another run published it first."""
    try:
        os.rename(tmp, dest)
        return True
    except OSError:
        if not (dest / MANIFEST).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def remove_stale_tmp(overlays: Path, max_age_s: float) -> list[Path]:
    """Delete temp build dirs older than `max_age_s` (left by killed runs); return what went."""
    now, removed = time.time(), []
    for entry in overlays.glob(".tmp-*"):
        try:
            if now - entry.lstat().st_mtime > max_age_s:
                shutil.rmtree(entry)
                removed.append(entry)
        except OSError:
            continue  # another run is removing it, or it is not ours to touch
    return removed
