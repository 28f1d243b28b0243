"""The reference patch (scenarios/patches/draft-reload.diff) applied by specwake.prepare.overlay to the vllm package
installed in this interpreter: it applies, leaves the installed files alone, and its patched modules import from the
overlay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specwake.prepare.overlay import (
    Overlay,
    build_overlay,
    inspect_patch,
)
from tests.helpers.paths import REPO
from tests.helpers.procs import installed_vllm

REFERENCE_PATCH = REPO / "scenarios" / "patches" / "draft-reload.diff"


def run_in_overlay(overlay: Overlay, code: str, cwd: Path) -> str:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(overlay.root)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def read_if_present(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


@pytest.fixture(scope="module")
def reference_overlay(tmp_path_factory) -> tuple[Overlay, Path, dict[str, bytes | None]]:
    """The reference patch applied to this interpreter's vllm; originals read before the build (None: the patch
    creates the file)."""
    assert REFERENCE_PATCH.is_file(), f"{REFERENCE_PATCH} is missing"
    package, version = installed_vllm()
    files = inspect_patch(REFERENCE_PATCH).patched_files
    originals = {rel: read_if_present(package.parent / rel) for rel in files}
    cache = tmp_path_factory.mktemp("reference") / "cache"
    return build_overlay(REFERENCE_PATCH, package, version, cache), package, originals


def test_reference_patch_applies_to_installed_vllm(reference_overlay):
    ov, package, originals = reference_overlay
    assert ov.patched_files and set(ov.patched_files) == set(originals)
    for rel in ov.patched_files:
        patched = ov.root / rel
        assert patched.is_file() and not patched.is_symlink()
        assert patched.read_bytes() != originals[rel]
        compile(patched.read_bytes(), str(patched), "exec")
        assert read_if_present(package.parent / rel) == originals[rel]
    assert any(original is None for original in originals.values()), "the patch adds reload/draft.py"
    assert (ov.root / "vllm" / "__init__.py").is_symlink()


def test_reference_patch_imports_from_overlay(reference_overlay, tmp_path):
    ov, _, _ = reference_overlay
    modules = [rel.removesuffix(".py").replace("/", ".") for rel in ov.patched_files]
    code = "import importlib\n" + "".join(f"print(importlib.import_module({m!r}).__file__)\n" for m in modules)
    printed = run_in_overlay(ov, code, cwd=tmp_path).splitlines()[-len(modules) :]
    assert printed == [str(ov.root / rel) for rel in ov.patched_files]
