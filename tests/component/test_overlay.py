"""Tests of specwake.prepare.overlay on a small fake `vllm` package built in tmp dirs, with the real git. (The reference
patch applied to the installed vLLM: tests/e2e/test_reference_patch.py.)"""

from __future__ import annotations

import compileall
import difflib
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specwake.errors import PatchError
from specwake.prepare.overlay import (
    MANIFEST,
    Overlay,
    build_overlay,
    inspect_patch,
    overlay_key,
    parse_patch,
    publish,
    remove_stale_tmp,
)
from tests.helpers.paths import REPO

REFERENCE_PATCH = REPO / "scenarios" / "patches" / "draft-reload.diff"

MOD = 'X = 1\n\n\ndef f():\n    return "stock"\n\n\ndef g():\n    return 10\n'
FILES = {
    "__init__.py": "",
    "mod.py": MOD,
    "sub/__init__.py": "",
    "sub/deep.py": "Y = 2\n",
    "data.txt": "not python\n",
}


def udiff(path: str, old: str | None, new: str | None) -> str:
    """A unified diff of one file as git writes it (a/ b/ prefixes, /dev/null for none)."""
    a = f"a/{path}" if old is not None else "/dev/null"
    b = f"b/{path}" if new is not None else "/dev/null"
    lines = difflib.unified_diff((old or "").splitlines(True), (new or "").splitlines(True), a, b, n=1)
    return "".join(lines)


GOOD_DIFF = (
    udiff("vllm/mod.py", MOD, MOD.replace('"stock"', '"patched"'))
    + udiff("vllm/sub/deep.py", "Y = 2\n", "Y = 3\n")
    + udiff("vllm/newfile.py", None, "Z = 9\n")
    + udiff("tests/test_thing.py", None, "def test():\n    pass\n")
    + udiff("docs/notes.md", "old\n", "new\n")
)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """site/vllm with a sub-package and compiled bytecode, like an installed package."""
    root = tmp_path / "site" / "vllm"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert compileall.compile_dir(root, quiet=1)
    return root


def write(tmp_path: Path, text: str | bytes, name: str = "x.diff") -> Path:
    path = tmp_path / "patches" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def snapshot(root: Path) -> dict[str, tuple[str, int, int, bool]]:
    """Every entry under `root`: content hash, mtime_ns, inode, is-symlink."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(root))] = (digest, st.st_mtime_ns, st.st_ino, path.is_symlink())
    return out


def run_in_overlay(overlay: Overlay, code: str, cwd: Path) -> str:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(overlay.root)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_patched_code_runs_from_overlay_and_package_is_untouched(tmp_path, package):
    before = snapshot(package)
    diff = write(tmp_path, GOOD_DIFF)
    ov = build_overlay(diff, package, "0.32.0", tmp_path / "cache")

    assert ov.root.parent == tmp_path / "cache" / "overlays"
    assert ov.root.name == ov.key and not ov.reused
    assert ov.patched_files == ("vllm/mod.py", "vllm/newfile.py", "vllm/sub/deep.py")
    assert ov.skipped_files == ("docs/notes.md", "tests/test_thing.py")
    code = (
        "import vllm, vllm.mod, vllm.sub.deep, vllm.newfile;"
        "print(vllm.mod.f(), vllm.mod.g(), vllm.sub.deep.Y, vllm.newfile.Z, vllm.__file__)"
    )
    out = run_in_overlay(ov, code, cwd=tmp_path).split()
    assert out[:4] == ["patched", "10", "3", "9"]
    assert Path(out[4]).parent == ov.root / "vllm"

    mirror = ov.root / "vllm"
    assert (mirror / "__init__.py").is_symlink()
    assert (mirror / "__init__.py").resolve() == (package / "__init__.py").resolve()
    assert (mirror / "data.txt").is_symlink() and (mirror / "sub" / "__init__.py").is_symlink()
    assert (mirror / "sub").is_dir() and not (mirror / "sub").is_symlink()
    for rel in ("mod.py", "sub/deep.py", "newfile.py"):
        assert not (mirror / rel).is_symlink()
    assert not (ov.root / "tests").exists() and not (ov.root / "docs").exists()
    assert snapshot(package) == before
    assert (package / "mod.py").read_text() == MOD


def test_stale_bytecode_of_patched_files_is_not_mirrored(tmp_path, package):
    ov = build_overlay(write(tmp_path, GOOD_DIFF), package, "0.32.0", tmp_path / "cache")
    cache = ov.root / "vllm" / "__pycache__"
    assert list(cache.glob("__init__.*.pyc")) and all(p.is_symlink() for p in cache.iterdir())
    assert not list(cache.glob("mod.*.pyc"))
    assert not list((ov.root / "vllm" / "sub" / "__pycache__").glob("deep.*.pyc"))


def test_manifest_records_the_build(tmp_path, package):
    diff = write(tmp_path, GOOD_DIFF)
    ov = build_overlay(diff, package, "0.32.0", tmp_path / "cache")
    manifest = json.loads((ov.root / MANIFEST).read_text())
    assert manifest["diff_sha256"] == hashlib.sha256(diff.read_bytes()).hexdigest()
    assert manifest["package_dir"] == str(package.resolve())
    assert manifest["vllm_version"] == "0.32.0"
    assert tuple(manifest["patched_files"]) == ov.patched_files


def test_hunk_that_does_not_apply_names_diff_file_and_hunk(tmp_path, package):
    changed = MOD.replace('"stock"', '"patched"').replace("return 10", "return 11")
    text = udiff("vllm/mod.py", MOD, changed).replace(" def g():", " def h():")
    diff = write(tmp_path, udiff("vllm/sub/deep.py", "Y = 2\n", "Y = 3\n") + text)
    hunk_line = int(text.split("@@ -")[2].split(",")[0])
    before = snapshot(package)

    with pytest.raises(PatchError) as err:
        build_overlay(diff, package, "0.32.0", tmp_path / "cache")

    msg = str(err.value)
    where = f"(tried against vLLM 0.32.0 at {package.resolve()})"
    assert msg == f"{diff}: vllm/mod.py: hunk #2 at line {hunk_line} does not apply {where}"
    assert "\n" not in msg
    assert list((tmp_path / "cache" / "overlays").iterdir()) == []
    assert snapshot(package) == before


def test_missing_target_file_is_named(tmp_path, package):
    diff = write(tmp_path, udiff("vllm/absent.py", "a = 1\n", "a = 2\n"))
    with pytest.raises(PatchError, match=r"x\.diff: vllm/absent\.py: No such file"):
        build_overlay(diff, package, "0.32.0", tmp_path / "cache")
    assert list((tmp_path / "cache" / "overlays").iterdir()) == []


def test_new_file_that_already_exists_is_rejected(tmp_path, package):
    diff = write(tmp_path, udiff("vllm/data.txt", None, "x\n"))
    with pytest.raises(PatchError, match=r"vllm/data\.txt: already exists"):
        build_overlay(diff, package, "0.32.0", tmp_path / "cache")


@pytest.mark.parametrize(
    "old, new",
    [
        ("a/vllm/../../etc/passwd", "b/vllm/../../etc/passwd"),
        ("a/../vllm/mod.py", "b/../vllm/mod.py"),
        ("/etc/passwd", "/etc/passwd"),
        ("a/vllm/mod.py", "/tmp/vllm/mod.py"),
        ("a/.git/hooks/pre-commit", "b/.git/hooks/pre-commit"),
    ],
)
def test_paths_leaving_the_package_are_rejected(tmp_path, old, new):
    text = f"--- {old}\n+++ {new}\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(PatchError, match=r"(absolute path|leaves the package|reaches into a .git)"):
        inspect_patch(write(tmp_path, text))


def test_git_header_with_dotdot_is_rejected(tmp_path):
    text = "diff --git a/vllm/../x.py b/vllm/../x.py\nnew file mode 100644\n"
    with pytest.raises(PatchError, match="leaves the package"):
        inspect_patch(write(tmp_path, text))


@pytest.mark.parametrize(
    "text, reason",
    [
        (b"", "empty diff"),
        (b"\n  \n", "empty diff"),
        (
            b"diff --git a/vllm/x.bin b/vllm/x.bin\nnew file mode 100644\n"
            b"index 0000000..1111111\nGIT binary patch\nliteral 3\nKcmZQzWB>pF00031\n\n",
            "binary patch",
        ),
        (
            b"diff --git a/vllm/x.bin b/vllm/x.bin\nindex 1..2 100644\n"
            b"Binary files a/vllm/x.bin and b/vllm/x.bin differ\n",
            "binary patch",
        ),
        (b"--- a/vllm/m.py\n+++ b/vllm/m.py\n@@ -1 +1 @@\n-a\0\n+b\n", "binary patch"),
        (b"just some text\nnot a patch\n", "not a unified diff"),
        (b"*** a/vllm/m.py\n--- b/vllm/m.py\n***************\n", "context diff"),
        (b"@@ -1 +1 @@\n-a\n+b\n", "before any file header"),
        (b"--- a/vllm/m.py\n+++ b/vllm/m.py\n@@ -1,3 +1,3 @@\n-a\n+b\n", "truncated"),
        (b"--- a/vllm/m.py\n+++ b/vllm/m.py\n", "without hunks"),
    ],
)
def test_malformed_diffs_are_rejected(tmp_path, text, reason):
    diff = write(tmp_path, text)
    with pytest.raises(PatchError, match=reason) as err:
        inspect_patch(diff)
    assert str(err.value).startswith(f"{diff}: ")


def test_unreadable_diff_is_a_patch_error(tmp_path, package):
    with pytest.raises(PatchError, match="cannot read patch"):
        build_overlay(tmp_path / "nope.diff", package, "0.32.0", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_diff_touching_nothing_under_vllm_is_rejected(tmp_path, package):
    diff = write(tmp_path, udiff("tests/test_x.py", None, "x = 1\n"))
    with pytest.raises(PatchError, match="touches no file under vllm/"):
        build_overlay(diff, package, "0.32.0", tmp_path / "cache")


def test_inspect_lists_files_and_hash(tmp_path):
    diff = write(tmp_path, GOOD_DIFF)
    info = inspect_patch(diff)
    assert info.sha256 == hashlib.sha256(GOOD_DIFF.encode()).hexdigest()
    assert info.patched_files == ("vllm/mod.py", "vllm/newfile.py", "vllm/sub/deep.py")
    assert info.skipped_files == ("docs/notes.md", "tests/test_thing.py")
    new = [fp for fp in info.files if fp.old_path is None]
    assert [fp.new_path for fp in new] == ["vllm/newfile.py", "tests/test_thing.py"]


def test_parser_follows_hunk_counts_and_git_extensions():
    body = (
        "diff --git a/vllm/q.sql b/vllm/q.sql\n"
        "index 1..2 100644\n"
        "--- a/vllm/q.sql\n"
        "+++ b/vllm/q.sql\n"
        "@@ -1,2 +1,2 @@\n"
        "--- a comment line that looks like a header\n"
        "+++ its replacement\n"
        " select 1;\n"
        "\\ No newline at end of file\n"
        'diff --git "a/vllm/caf\\303\\251.py" "b/vllm/new name.py"\n'
        "similarity index 100%\n"
        'rename from "vllm/caf\\303\\251.py"\n'
        "rename to vllm/new name.py\n"
        "diff --git a/vllm/gone.py b/vllm/gone.py\n"
        "deleted file mode 100644\n"
        "--- a/vllm/gone.py\n"
        "+++ /dev/null\n"
        "@@ -1 +0,0 @@\n"
        "-x = 1\n"
    )
    info = parse_patch(body.encode(), "p.diff")
    assert [(f.old_path, f.new_path) for f in info.files] == [
        ("vllm/q.sql", "vllm/q.sql"),
        ("vllm/café.py", "vllm/new name.py"),
        ("vllm/gone.py", None),
    ]
    assert info.patched_files == ("vllm/gone.py", "vllm/new name.py", "vllm/q.sql")


def test_rename_across_package_boundary_is_rejected():
    body = "diff --git a/vllm/a.py b/tests/a.py\nrename from vllm/a.py\nrename to tests/a.py\n"
    with pytest.raises(PatchError, match="across the vllm/ boundary"):
        parse_patch(body.encode(), "p.diff")


def test_file_deleted_then_created_again_keeps_both_sides_apart():
    body = udiff("vllm/sub/deep.py", "Y = 2\n", None) + udiff("vllm/sub/deep.py", None, "Y = 4\n")
    info = parse_patch(body.encode(), "p.diff")
    assert [(f.old_path, f.new_path) for f in info.files] == [("vllm/sub/deep.py", None), (None, "vllm/sub/deep.py")]
    assert info.patched_files == ("vllm/sub/deep.py",)


def test_rename_source_is_copied_before_git_reads_it(tmp_path, package):
    body = (
        "diff --git a/vllm/mod.py b/vllm/moved.py\n"
        "similarity index 100%\n"
        "rename from vllm/mod.py\n"
        "rename to vllm/moved.py\n"
    )
    ov = build_overlay(write(tmp_path, body), package, "0.32.0", tmp_path / "cache")
    assert ov.patched_files == ("vllm/moved.py",)
    assert (ov.root / "vllm" / "moved.py").read_text() == MOD
    assert not (ov.root / "vllm" / "mod.py").exists() and (package / "mod.py").read_text() == MOD


@pytest.mark.parametrize(
    "text, reason",
    [
        ("diff --git a//etc/passwd b//etc/passwd\nnew file mode 100644\n", "absolute path '/etc/passwd'"),
        (
            "diff --git a/vllm/l b/vllm/l\nnew file mode 120000\nindex 0000000..1111111\n"
            "--- /dev/null\n+++ b/vllm/l\n@@ -0,0 +1 @@\n+/etc\n\\ No newline at end of file\n",
            "symlinks in a patch are not supported",
        ),
        ("Binary files a/vllm/x.bin and b/vllm/x.bin differ\n", "binary patch"),
    ],
)
def test_more_unsupported_diffs_are_rejected(tmp_path, text, reason):
    diff = write(tmp_path, text)
    with pytest.raises(PatchError, match=reason) as err:
        inspect_patch(diff)
    assert str(err.value).startswith(f"{diff}: ") and "\n" not in str(err.value)


def test_inspect_ignores_the_git_checkout_it_runs_in(tmp_path, monkeypatch):
    repo = tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, capture_output=True)
    (repo / ".git" / "config").write_text("[apply\n\tthis is not git config\n")  # git dies on it
    (repo / "docs").mkdir()
    monkeypatch.chdir(repo / "docs")  # in a repository subfolder git would also filter paths by it
    info = inspect_patch(write(tmp_path, GOOD_DIFF))
    assert info.patched_files == ("vllm/mod.py", "vllm/newfile.py", "vllm/sub/deep.py")


def test_first_failing_hunk_is_named_when_several_fail(tmp_path, package):
    changed = MOD.replace('"stock"', '"patched"').replace("return 10", "return 11")
    text = udiff("vllm/mod.py", MOD, changed).replace(" def g():", " def h():").replace(" def f():", " def F():")
    diff = write(tmp_path, text)
    with pytest.raises(PatchError, match=r"x\.diff: vllm/mod\.py: hunk #1 at line 4 does not apply \(tried"):
        build_overlay(diff, package, "0.32.0", tmp_path / "cache")


def test_finished_overlay_is_reused_without_applying(tmp_path, package, monkeypatch):
    diff = write(tmp_path, GOOD_DIFF)
    first = build_overlay(diff, package, "0.32.0", tmp_path / "cache")
    before = snapshot(first.root)
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))  # a second `git apply` would fail
    second = build_overlay(diff, package, "0.32.0", tmp_path / "cache")
    assert second.reused and not first.reused
    assert (second.root, second.key, second.patched_files) == (
        first.root,
        first.key,
        first.patched_files,
    )
    assert snapshot(first.root) == before
    assert [p.name for p in (tmp_path / "cache" / "overlays").iterdir()] == [first.key]


def test_no_git_is_an_infra_error(tmp_path, package, monkeypatch):
    from specwake.errors import InfraError

    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    with pytest.raises(InfraError, match="git is not installed"):
        build_overlay(write(tmp_path, GOOD_DIFF), package, "0.32.0", tmp_path / "cache")
    assert list((tmp_path / "cache" / "overlays").iterdir()) == []


def _build_in_child(args: tuple[str, str, str, object]) -> tuple[str, tuple[str, ...], bool]:
    diff, package, cache, barrier = args
    barrier.wait()  # type: ignore[attr-defined]
    ov = build_overlay(Path(diff), Path(package), "0.32.0", Path(cache))
    return str(ov.root), ov.patched_files, ov.reused


def test_two_builds_at_once_both_succeed_and_agree(tmp_path, package):
    for i in range(300):  # a bigger package widens the window in which both builds run
        (package / "sub" / f"m{i}.py").write_text(f"V = {i}\n")
    diff, cache = write(tmp_path, GOOD_DIFF), tmp_path / "cache"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(2) as pool:
        barrier = manager.Barrier(2)
        args = [(str(diff), str(package), str(cache), barrier)] * 2
        results = pool.map(_build_in_child, args)
    (root_a, files_a, reused_a), (root_b, files_b, reused_b) = results
    assert root_a == root_b and files_a == files_b
    assert sorted([reused_a, reused_b]) == [False, True]  # one built it, the other used it
    assert [p.name for p in (cache / "overlays").iterdir()] == [Path(root_a).name]
    ov = Overlay(Path(root_a), files_a, (), Path(root_a).name, True)
    assert run_in_overlay(ov, "import vllm.mod; print(vllm.mod.f())", tmp_path) == "patched"


def test_publish_after_another_run_won_discards_ours(tmp_path):
    dest = tmp_path / "overlays" / "k"
    (dest / "vllm").mkdir(parents=True)
    (dest / MANIFEST).write_text("{}")
    tmp = tmp_path / "overlays" / ".tmp-k-1"
    (tmp / "vllm").mkdir(parents=True)
    (tmp / MANIFEST).write_text('{"ours": true}')
    assert publish(tmp, dest) is False
    assert not tmp.exists() and (dest / MANIFEST).read_text() == "{}"


def test_stale_temp_dirs_are_removed(tmp_path):
    old, fresh = tmp_path / ".tmp-a-1", tmp_path / ".tmp-b-2"
    (old / "vllm").mkdir(parents=True)
    fresh.mkdir()
    os.utime(old, (1_000_000, 1_000_000))
    assert remove_stale_tmp(tmp_path, 3600) == [old]
    assert not old.exists() and fresh.exists()


def test_key_depends_on_version_diff_and_package(tmp_path, package):
    diff = write(tmp_path, GOOD_DIFF)
    a = build_overlay(diff, package, "0.32.0", tmp_path / "cache")
    b = build_overlay(diff, package, "0.33.0", tmp_path / "cache")
    assert a.key != b.key and a.root != b.root and not b.reused
    sha = hashlib.sha256(GOOD_DIFF.encode()).hexdigest()
    assert a.key == overlay_key(sha, "0.32.0", package.resolve())
    assert overlay_key(sha, "0.32.0", Path("/other/vllm")) != a.key
    assert overlay_key(sha[::-1], "0.32.0", package.resolve()) != a.key


def test_cache_inside_a_git_checkout(tmp_path, package):
    repo = tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, capture_output=True)
    ov = build_overlay(write(tmp_path, GOOD_DIFF), package, "0.32.0", repo / ".cache")
    assert ov.root.parent == repo / ".cache" / "overlays"
    assert (ov.root / "vllm" / "sub" / "deep.py").read_text() == "Y = 3\n"


def test_user_git_config_is_not_read(tmp_path, package, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[apply\n\tthis is not git config\n")  # git dies on it
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    text = udiff("vllm/sub/deep.py", "Y = 2\n", "Y = 3   \n")  # trailing whitespace kept
    ov = build_overlay(write(tmp_path, text), package, "0.32.0", tmp_path / "cache")
    assert (ov.root / "vllm" / "sub" / "deep.py").read_text() == "Y = 3   \n"
