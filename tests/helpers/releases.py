"""The Python sources of the vLLM releases specwake's GPU path supports, as the GPU wheels ship them.

A GPU wheel cannot be installed or imported here, but its Python files can be read: `release_tree("0.33.0")`
downloads the wheel with pip (`pip download --no-deps vllm==0.33.0`), unpacks `vllm/**.py` into specwake's cache
(`<cache>/vllm-sources/0.33.0/vllm/...`) and returns the folder that holds `vllm/`. Only the first call downloads.

`supported_releases()` names the releases: specwake.prepare.releases.TESTED_RELEASES, one of each series the `gpu`
extra of pyproject.toml allows. Each shipped patch names in its header the releases it is for (`patch_header_releases`);
tests/e2e/test_releases.py holds headers, tested releases, the extra and the scenarios' per-release patches in
agreement.
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
from specwake.prepare.overlay import header_releases
from specwake.prepare.releases import TESTED_RELEASES
from tests.helpers.paths import REPO

PYPROJECT = REPO / "pyproject.toml"
PATCHES = sorted((REPO / "scenarios" / "patches").glob("*.diff"))
DOWNLOAD_TIMEOUT_S = 900
_DONE = ".complete"  # written last: a folder without it is a download that did not finish
# A patch for some release series only: draft-reload-0.34.diff is the draft-reload fix for 0.34.
_SERIES_SUFFIX = re.compile(r"-\d+\.\d+$")


def extra_requirement(extra: str, package: str) -> str:
    """An extra's requirement of `package`, e.g. extra_requirement("gpu", "vllm") == "vllm>=0.32,<0.35"."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][extra]
    (found,) = [r for r in extras if re.match(rf"{re.escape(package)}\s*[<>=!~;\[]", r)]
    return found


def gpu_requirement() -> str:
    """The `gpu` extra's vllm requirement, e.g. "vllm>=0.32,<0.35"."""
    return extra_requirement("gpu", "vllm")


def patch_header_releases(patch: Path) -> list[str]:
    """The releases a shipped patch's header says it applies to (read as `check` reads it)."""
    found = header_releases(patch.read_bytes())
    if found is None:
        raise AssertionError(f"{patch.name}: the header names no releases as '(vLLM X.Y.Z, ...)'")
    return list(found)


def patch_family(patch: Path) -> str:
    """The fix a shipped patch is one release series' version of: draft-reload-0.34.diff → "draft-reload"."""
    return _SERIES_SUFFIX.sub("", patch.stem)


def patches_for(version: str) -> list[Path]:
    """The shipped patches whose header names release `version`: those the release tests apply to it."""
    return [p for p in PATCHES if version in patch_header_releases(p)]


def supported_releases() -> list[str]:
    return list(TESTED_RELEASES)


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
