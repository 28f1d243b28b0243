"""Probing a variant's interpreter: what it reports, the per-installation cache, and a missing vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specwake.errors import EngineMissing
from specwake.prepare.engine import install_stamp, probe_engine, resolve_python
from tests.helpers.procs import installed_vllm


def test_probe_is_cached_per_installation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Needs vLLM in this interpreter (make test installs it); without it this fails rather than skips."""
    info = probe_engine(sys.executable, tmp_path)
    package, version = installed_vllm()  # found without importing vLLM: by its package's location and metadata
    assert info.vllm_version == version
    assert info.package_dir == package
    assert info.platform in ("cpu", "cuda", "rocm") and info.python == sys.executable
    cached = list((tmp_path / "engines").glob("*.json"))
    assert len(cached) == 1
    # The cached answer is used (not a new import): corrupting the version in the file shows through.
    cached[0].write_text(cached[0].read_text().replace(info.vllm_version, "9.9.9-cached"))
    assert probe_engine(sys.executable, tmp_path).vllm_version == "9.9.9-cached"
    # GPU visibility is part of the key: a different CUDA_VISIBLE_DEVICES is a different entry.
    stamp = install_stamp(sys.executable)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert install_stamp(sys.executable) != stamp


def test_stamp_changes_when_an_installation_changes(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    before = install_stamp(python)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "vllm-0.0.1.dist-info").mkdir()  # what a (re)install leaves behind
    after = install_stamp(python)
    assert before is not None and after is not None and before != after


def test_missing_vllm_is_engine_missing(tmp_path: Path) -> None:
    venv = tmp_path / "empty"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    with pytest.raises(EngineMissing, match="cannot import vllm") as info:
        probe_engine(str(venv / "bin" / "python"), tmp_path / "cache")
    assert info.value.exit_code == 3
    assert not list((tmp_path / "cache").glob("engines/*.json"))  # failures are not cached


def test_resolve_python(tmp_path: Path) -> None:
    assert resolve_python(None) == sys.executable
    with pytest.raises(EngineMissing, match="not found"):
        resolve_python(str(tmp_path / "nope" / "python"))
    assert os.path.isabs(resolve_python("python3"))
