"""The pure parts of `specwake bisect` (specwake/run/bisect.py); tests/e2e/test_bisect.py bisects a real history."""

from __future__ import annotations

from specwake.run.bisect import not_python


def test_bisect_overlays_only_python_under_vllm() -> None:
    changed = [
        "vllm/config/model.py",
        "csrc/attention.cu",
        "CMakeLists.txt",
        "setup.py",
        "vllm/_C.abi3.so",
        "docs/x.md",
    ]
    assert not_python(changed) == changed[1:]
