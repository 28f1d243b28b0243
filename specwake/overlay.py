"""Patched-vLLM overlay: apply a unified diff to a symlink mirror of an installed `vllm` package.

It lives in `<cache>/overlays/<key>/`: built in a temp dir, renamed into place, then reused.
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

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_HEADER = re.compile(rb"^diff --git (\S+|\"(?:[^\"\\]|\\.)*\") (\S+|\"(?:[^\"\\]|\\.)*\")$")
_FAILED_HUNK = re.compile(r"patch failed: (.+):(\d+)$")
_PATH_ERROR = re.compile(r"^error: (.+?): (.+)$")


@dataclass(frozen=True)
class FilePatch:
    """One file of a diff; paths look like `vllm/...` (after -p1), None means /dev/null."""

    old_path: str | None
    new_path: str | None
    hunk_lines: tuple[int, ...]  # old-file start line of each hunk, in diff order

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
    """The pure half of `inspect_patch`: `name` only labels error messages."""
    if not data.strip():
        raise PatchError(f"{name}: empty diff")
    if b"\0" in data:
        raise PatchError(f"{name}: binary patch (NUL bytes) is not supported")
    files = tuple(_parse_files(data.splitlines(), name))
    if not files:
        raise PatchError(f"{name}: not a unified diff (no ---/+++ file headers)")
    inside: list[str] = []
    outside: list[str] = []
    for fp in files:
        sides = [p for p in (fp.old_path, fp.new_path) if p is not None]
        in_pkg = [p.startswith(PACKAGE + "/") for p in sides]
        if any(in_pkg) and not all(in_pkg):
            raise PatchError(f"{name}: {fp.path}: moves a file across the {PACKAGE}/ boundary")
        (inside if all(in_pkg) else outside).append(fp.path)
    if not inside:
        raise PatchError(f"{name}: touches no file under {PACKAGE}/ (paths must be a/{PACKAGE}/...)")
    return PatchInfo(
        path=Path(name),
        sha256=hashlib.sha256(data).hexdigest(),
        files=files,
        patched_files=tuple(sorted(set(inside))),
        skipped_files=tuple(sorted(set(outside))),
    )


def _parse_files(lines: list[bytes], name: str) -> list[FilePatch]:
    """Walk the diff's file headers and hunks; hunk bodies are consumed by their line counts."""
    files: list[FilePatch] = []
    old: str | None = None
    new: str | None = None
    hunks: list[int] = []
    started = False  # a file header has been seen and not yet flushed
    git_record = False

    def flush() -> None:
        if started:
            if not hunks and not git_record:
                raise PatchError(f"{name}: {new or old}: file header without hunks")
            files.append(FilePatch(old, new, tuple(hunks)))

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"GIT binary patch") or (line.startswith(b"Binary files ") and line.endswith(b" differ")):
            raise PatchError(f"{name}: binary patch at line {i + 1} is not supported")
        if line.startswith(b"*** ") and i + 1 < len(lines) and lines[i + 1].startswith(b"--- "):
            raise PatchError(f"{name}: context diff at line {i + 1}; a unified diff is needed")
        git = _GIT_HEADER.match(line)
        if git:
            flush()
            started, git_record, hunks = True, True, []
            old, new = (_strip(_unquote(g), name, i) for g in git.groups())
        elif line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            a = _header_path(line[4:], name, i)
            b = _header_path(lines[i + 1][4:], name, i + 1)
            if not (git_record and started and not hunks):
                flush()
                started, git_record, hunks = True, False, []
            old, new = a, b
            i += 1
        elif git_record and started and line.startswith((b"new file mode", b"deleted file mode")):
            if line.endswith(b"120000"):
                raise PatchError(f"{name}: symlinks in a patch are not supported (line {i + 1})")
            if line.startswith(b"new"):
                old = None
            else:
                new = None
        elif git_record and started and line.startswith((b"rename from ", b"copy from ")):
            old = _strip(_unquote(line.split(b" ", 2)[2]), name, i, prefixed=False)
        elif git_record and started and line.startswith((b"rename to ", b"copy to ")):
            new = _strip(_unquote(line.split(b" ", 2)[2]), name, i, prefixed=False)
        elif line.startswith(b"@@"):
            if not started:
                raise PatchError(f"{name}: hunk at line {i + 1} comes before any file header")
            i, start = _skip_hunk(lines, i, name)
            hunks.append(start)
            continue
        i += 1
    flush()
    return files


def _skip_hunk(lines: list[bytes], i: int, name: str) -> tuple[int, int]:
    """(index after the hunk starting at `lines[i]`, its old start line); raise if malformed."""
    m = _HUNK.match(lines[i])
    if not m:
        raise PatchError(f"{name}: malformed hunk header at line {i + 1}")
    old_left = int(m.group(2)) if m.group(2) is not None else 1
    new_left = int(m.group(4)) if m.group(4) is not None else 1
    j = i + 1
    while old_left > 0 or new_left > 0:
        body = lines[j] if j < len(lines) else None
        tag = body[:1] if body else b" "  # an empty line is an empty context line
        if body is None or tag not in (b" ", b"-", b"+", b"\\"):
            raise PatchError(f"{name}: hunk at line {i + 1} is truncated (diff line {j + 1})")
        old_left -= tag in (b" ", b"-")
        new_left -= tag in (b" ", b"+")
        j += 1
    while j < len(lines) and lines[j].startswith(b"\\"):  # "\ No newline at end of file"
        j += 1
    return j, int(m.group(1))


def _unquote(raw: bytes) -> bytes:
    """Undo git's C-style quoting of unusual paths ("a/caf\\303\\251.py")."""
    if not (raw.startswith(b'"') and raw.endswith(b'"') and len(raw) >= 2):
        return raw
    body, out, k = raw[1:-1], bytearray(), 0
    simple = {b"n": b"\n", b"t": b"\t", b'"': b'"', b"\\": b"\\", b"a": b"\a", b"b": b"\b"}
    simple |= {b"f": b"\f", b"r": b"\r", b"v": b"\v"}
    while k < len(body):
        c = body[k : k + 1]
        if c == b"\\" and body[k + 1 : k + 4].isdigit():
            out.append(int(body[k + 1 : k + 4], 8))
            k += 4
        elif c == b"\\" and body[k + 1 : k + 2] in simple:
            out += simple[body[k + 1 : k + 2]]
            k += 2
        else:
            out += c
            k += 1
    return bytes(out)


def _header_path(raw: bytes, name: str, i: int) -> str | None:
    """A `---`/`+++` header's path (timestamp after a tab dropped); None for /dev/null."""
    raw = _unquote(raw.split(b"\t", 1)[0].rstrip(b"\r"))
    if raw == b"/dev/null":
        return None
    return _strip(raw, name, i)


def _strip(raw: bytes, name: str, i: int, prefixed: bool = True) -> str:
    """Decode a diff path and drop its first STRIP components (`a/`), rejecting unsafe paths."""
    path = raw.decode("utf-8", "surrogateescape")
    if path.startswith("/") or path.startswith("~"):
        raise PatchError(f"{name}: absolute path {path!r} at line {i + 1}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PatchError(f"{name}: path {path!r} at line {i + 1} leaves the package ('..')")
    if ".git" in parts:
        raise PatchError(f"{name}: path {path!r} at line {i + 1} reaches into a .git folder")
    kept = parts[STRIP:] if prefixed else parts
    if not kept:
        raise PatchError(f"{name}: path {path!r} at line {i + 1} is empty after -p{STRIP}")
    return "/".join(kept)


def overlay_key(diff_sha256: str, vllm_version: str, package_dir: Path) -> str:
    """Key of an overlay: sha256 of (layout, diff, vLLM version, package path), 20 hex digits."""
    fields = [LAYOUT, diff_sha256, vllm_version, str(package_dir)]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:20]


def build_overlay(diff_path: Path, package_dir: Path, vllm_version: str, cache: Path) -> Overlay:
    """Return the overlay of `package_dir` patched by `diff_path`, building it unless it exists."""
    data = _read(diff_path)
    info = parse_patch(data, str(diff_path))
    package = package_dir.resolve()
    if not (package / "__init__.py").is_file():
        raise EngineMissing(f"{package_dir}: not an installed {PACKAGE} package (no __init__.py)")
    key = overlay_key(info.sha256, vllm_version, package)
    overlays = cache / "overlays"
    dest = overlays / key

    def result(reused: bool) -> Overlay:
        return Overlay(dest, info.patched_files, info.skipped_files, key, reused)

    if (dest / MANIFEST).is_file():
        return result(reused=True)
    try:
        overlays.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(overlays, STALE_TMP_S)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=overlays))
    except OSError as exc:
        raise InfraError(f"cannot create overlay folder in {overlays}: {exc}") from exc
    try:
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
    return result(reused=not won)


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
            continue  # missing: `git apply --check` reports it
        src = link.resolve()
        link.unlink()
        shutil.copy2(src, link)
        for pyc in (link.parent / "__pycache__").glob(f"{link.stem}.*.pyc"):
            pyc.unlink()


def git_env() -> dict[str, str]:
    """Environment for `git apply`: no system/global config, no repository discovery above cwd."""
    env = dict(os.environ)
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    for var in (
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
    ):
        env.pop(var, None)
    return env


def git_apply_argv(check: bool) -> list[str]:
    argv = ["git", "apply", f"-p{STRIP}", f"--include={PACKAGE}/*", "--whitespace=nowarn"]
    return argv + (["--check"] if check else []) + ["-"]


def apply_diff(root: Path, data: bytes, info: PatchInfo) -> None:
    """`git apply --check`, then `git apply`, with cwd = `root`; raise PatchError on failure."""
    env = git_env()
    # Stop git from finding a repository above the overlay (the cache may sit inside a checkout).
    env["GIT_CEILING_DIRECTORIES"] = str(root.parent)
    for check in (True, False):
        try:
            proc = subprocess.run(
                git_apply_argv(check),
                input=data,
                cwd=root,
                env=env,
                capture_output=True,
                timeout=GIT_TIMEOUT_S,
            )
        except FileNotFoundError as exc:
            raise InfraError("git is not installed; it is needed to apply patches") from exc
        except subprocess.TimeoutExpired as exc:
            raise InfraError(f"git apply on {info.path} took over {GIT_TIMEOUT_S:.0f} s") from exc
        if proc.returncode != 0:
            stderr = proc.stderr.decode("utf-8", "replace")
            raise PatchError(describe_failure(str(info.path), stderr, info))


def describe_failure(name: str, stderr: str, info: PatchInfo) -> str:
    """One line naming the diff, the target file and the failing hunk from git's stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        m = _FAILED_HUNK.search(ln)
        if m:
            path, line = m.group(1), int(m.group(2))
            starts = [fp.hunk_lines for fp in info.files if fp.path == path or fp.old_path == path]
            number = starts[0].index(line) + 1 if starts and line in starts[0] else None
            hunk = f"hunk #{number} at line {line}" if number else f"hunk at line {line}"
            return f"{name}: {path}: {hunk} does not apply"
    for ln in lines:
        m = _PATH_ERROR.match(ln)
        if m:
            return f"{name}: {m.group(1)}: {m.group(2)}"
    detail = lines[0].removeprefix("error: ") if lines else "git apply failed"
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
