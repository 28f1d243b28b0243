"""A library that uses vllm where it can import it, as some do (``try: import vllm``): a warm base, which may not
import vllm, must not keep "no vllm" for its launchers (specwake.worker.warm)."""

from __future__ import annotations

try:
    import vllm  # noqa: F401, TID251 (the overlay's, on PYTHONPATH)

    HAS_VLLM = True
except ImportError:
    HAS_VLLM = False
