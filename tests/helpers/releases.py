"""The Python sources of the vLLM releases specwake's GPU path supports, as the GPU wheels ship them.

A GPU wheel cannot be installed or imported here, but its Python files can be read: `release_tree("0.33.0")`
downloads the wheel with pip (`pip download --no-deps vllm==0.33.0`), unpacks `vllm/**.py` into specwake's cache
(`<cache>/vllm-sources/0.33.0/vllm/...`) and returns the folder that holds `vllm/`. Only the first call downloads.

`supported_releases()` names the releases: those the reference patch's header lists, which must be the ones the
`gpu` extra of pyproject.toml allows (tests/e2e/test_releases.py holds the two in agreement).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from specwake.prepare.models import cache_dir
from tests.helpers.paths import REPO

PYPROJECT = REPO / "pyproject.toml"
REFERENCE_PATCH = REPO / "scenarios" / "patches" / "draft-reload.diff"
DOWNLOAD_TIMEOUT_S = 900
_DONE = ".complete"  # written last: a folder without it is a download that did not finish
# Where the patch header names its releases: "... in the directory that contains vllm/ (vLLM 0.32.0, 0.33.0)."
_HEADER_RELEASES = re.compile(r"\(vLLM (\d+\.\d+\.\d+(?:, \d+\.\d+\.\d+)*)\)")


def gpu_requirement() -> str:
    """The `gpu` extra's vllm requirement, e.g. "vllm>=0.32,<0.34"."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["gpu"]
    (vllm,) = [r for r in extras if r.replace(" ", "").startswith("vllm")]
    return vllm


def patch_header_releases(patch: Path = REFERENCE_PATCH) -> list[str]:
    """The releases a shipped patch's header says it applies to."""
    found = _HEADER_RELEASES.search(patch.read_text().split("\ndiff --git ", 1)[0])
    if found is None:
        raise AssertionError(f"{patch.name}: the header names no releases as '(vLLM X.Y.Z, ...)'")
    return [v.strip() for v in found.group(1).split(",") if v.strip()]


def supported_releases() -> list[str]:
    return patch_header_releases()


def release_tree(version: str) -> Path:
    """The folder holding release `version`'s `vllm/` Python sources (downloaded and unpacked on first use)."""
    root = cache_dir() / "vllm-sources"
    dest = root / version
    if (dest / _DONE).is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{version}-") as tmp:
        staging = Path(tmp)
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        argv += ["--dest", str(staging / "wheel"), f"vllm=={version}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download vllm=={version} failed: {proc.stderr.strip()[-2000:]}")
        (wheel,) = (staging / "wheel").glob("vllm-*.whl")
        tree = staging / "tree"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tree, [n for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")])
        (tree / _DONE).write_text(wheel.name + "\n")
        try:
            tree.rename(dest)
        except OSError:  # another process finished first (or a stale partial folder is in the way)
            if not (dest / _DONE).is_file():
                shutil.rmtree(dest, ignore_errors=True)
                tree.rename(dest)
    return dest
