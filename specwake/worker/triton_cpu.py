"""Model Runner V2 on a CPU: vLLM's V2 runner writes its batch bookkeeping (input preparation, sampling, the drafters'
steps) as Triton programs, and a CPU build of vLLM counts Triton usable only where Triton has a backend named "cpu"
(vllm/triton_utils/importing.py). The registry's triton has only its GPU backends, so vLLM refuses the runner: "Model
Runner V2 requires Triton." (vllm/config/vllm.py, ``_validate_v2_model_runner``).

Triton's own interpreter (``TRITON_INTERPRET=1``) runs every ``@triton.jit`` program on CPU tensors, one program
instance after another, with numpy: no compiler and no driver are involved. `interpret_triton_on_cpu` gives vLLM the
"cpu" backend entry it looks for, with a driver that says it is active, so that vLLM's own choice of runner is made as
on a GPU; the programs themselves then run in the interpreter. It must run before vLLM is imported, in every process
that imports it (vLLM reads the answer once, when ``vllm.triton_utils`` is imported): specwake's server launcher and
its in-process validation call it first thing.

What this is not: the compiled GPU kernels (Triton's or vLLM's CUDA ops), CUDA graphs, or the cumem allocator that a
GPU's sleep mode uses. Those stay GPU-only.

Two changes to the interpreter's bookkeeping, not to what it computes. First, at every launch it swaps triton.language's
builtins (``tl.load``, ``tl.arange``, ...) for its own, walking each module with ``inspect.getmembers``, and swaps them
back after (``triton/runtime/interpreter.py``: ``_patch_lang``). That walk was a quarter of a V2 decode step's Triton
time on the builtin models. In a process where Triton only ever interprets there is nothing to swap back to, so
`patch_language_once` makes the swap once and keeps it (``SPECWAKE_TRITON_PATCH_ONCE=0`` leaves the interpreter as
shipped, as does a Triton whose interpreter has no ``_patch_lang``). The programs, their grids and every value they
compute are the same; benchmarks/bench_runners.py prints what it saves.

Second, under the same switch: the interpreter asks for the numpy dtype of a Triton type (``_get_np_dtype``) at
almost every operation, and each call builds a table of twenty entries to look it up. `cache_np_dtypes` answers from a
table kept across calls, filled by the shipped function as types are met: a tenth of a V2 decode step's Triton time on
the builtin models (64 tokens offline: 0.805 → 0.735 s, median of five runs each).

Switched on by ``SPECWAKE_TRITON_ON_CPU=1`` (specwake's plan sets it, with ``TRITON_INTERPRET=1``, for a CPU server on
Model Runner V2). This module imports nothing of specwake's and nothing of vLLM's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

SWITCH = "SPECWAKE_TRITON_ON_CPU"  # plan.TRITON_ON_CPU
INTERPRET = "TRITON_INTERPRET"  # Triton's own switch (triton/knobs.py, runtime.interpret)
PATCH_ONCE = "SPECWAKE_TRITON_PATCH_ONCE"  # "0": the interpreter's bookkeeping as shipped (both changes below)
BACKEND = "cpu"  # the name vLLM's CPU build looks up in triton.backends.backends


def _wall_clock_bench(
    kernel_call: Callable[[], object], *, quantiles: list[float] | None = None, **_: Any
) -> list[float]:
    """Triton's autotuner asks the active driver for a benchmarker when a kernel has several configurations: one call,
    timed by the wall clock, in milliseconds (every quantile the same)."""
    start = time.perf_counter()
    kernel_call()
    elapsed_ms = (time.perf_counter() - start) * 1e3
    return [elapsed_ms] * len(quantiles or [0.5])


def interpret_triton_on_cpu() -> bool:
    """Where the environment says ``SPECWAKE_TRITON_ON_CPU=1``: Triton programs interpreted, and a "cpu" backend entry
    for vLLM to find. True when it did so; nothing happens otherwise (a GPU server, or V1 on CPU)."""
    if os.environ.get(SWITCH) != "1":
        return False
    os.environ[INTERPRET] = "1"
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.backends.driver import DriverBase

    class InterpreterDriver(DriverBase):
        """The entry vLLM asks ``is_active()`` of; the interpreter itself never asks a driver for anything. Being the
        only active backend, it is also what ``triton.runtime.driver.active`` builds when code asks which device it
        runs on: vLLM's flash-linear-attention ops do, when imported (the gated-delta-net models: Qwen3-Next,
        Qwen3.5), and are told "cpu", what they assume when no driver answers."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self) -> GPUTarget:
            return GPUTarget(BACKEND, 0, 1)

        def get_active_torch_device(self) -> Any:
            import torch

            return torch.device(BACKEND)

        def get_benchmarker(self) -> Callable[..., list[float]]:
            return _wall_clock_bench

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise NotImplementedError("the Triton interpreter compiles nothing")

    backends.setdefault(BACKEND, Backend(compiler=BaseBackend, driver=InterpreterDriver))
    if os.environ.get(PATCH_ONCE) != "0":
        patch_language_once()
        cache_np_dtypes()
    return True


class _KeptPatch:
    """What the interpreter's launch gets back instead of the scope it would undo after the grid: nothing to undo."""

    def restore(self) -> None:
        pass


# The interpreter's functions specwake replaces, and the attribute that marks a replacement as specwake's.
_LANGUAGE = ("_patch_lang", "kept")
_DTYPES = ("_get_np_dtype", "cached")


def _replace(function: tuple[str, str], build: Callable[[Any, Callable[..., Any]], Callable[..., Any]]) -> bool:
    """The interpreter's `function` replaced by what `build(interpreter module, shipped function)` makes. True when
    replaced (or replaced already); False where this Triton's interpreter has no such function, which leaves it as
    shipped."""
    from triton.runtime import interpreter

    name, mark = function
    shipped = getattr(interpreter, name, None)
    if shipped is None:
        return False
    if not getattr(shipped, mark, False):
        replacement = build(interpreter, shipped)
        setattr(replacement, mark, True)
        setattr(interpreter, name, replacement)
    return True


def _replaced(function: tuple[str, str]) -> bool:
    """Whether this process's interpreter runs specwake's replacement of `function` (imports nothing)."""
    name, mark = function
    interpreter = sys.modules.get("triton.runtime.interpreter")
    return bool(getattr(getattr(interpreter, name, None), mark, False))


def patch_language_once() -> bool:
    """Triton's interpreter given triton.language's interpreted builtins for good, made at its first launch, instead of
    made and undone at every launch (module docstring). True when installed (or installed already); False where this
    Triton's interpreter has no ``_patch_lang`` to replace, which leaves it as shipped."""
    return _replace(_LANGUAGE, _language_once)


def _language_once(interpreter: Any, shipped: Callable[..., Any]) -> Callable[[object], _KeptPatch]:
    tl = interpreter.tl
    # The shipped function patches the modules among (tl, tl.core) that a program's globals hold: both, the first time.
    every_language = type("Program", (), {"__globals__": {"tl": tl, "core": tl.core}})
    patched = False

    def patch_once(fn: object) -> _KeptPatch:
        nonlocal patched
        if not patched:
            shipped(every_language)
            patched = True
        return _KeptPatch()

    return patch_once


def language_kept() -> bool:
    """Whether this process's Triton interpreter runs with `patch_language_once` installed (imports nothing)."""
    return _replaced(_LANGUAGE)


def cache_np_dtypes() -> bool:
    """Triton's interpreter answering its numpy dtype lookups from a table kept across calls (module docstring). A block
    type is looked up by its element type and a pointer is uint64, as the shipped function does; every other type is
    asked of the shipped function once, errors included. True when installed (or installed already); False where this
    Triton's interpreter has no ``_get_np_dtype``, which leaves it as shipped."""
    return _replace(_DTYPES, _dtype_table)


def _dtype_table(interpreter: Any, shipped: Callable[[Any], Any]) -> Callable[[Any], Any]:
    tl = interpreter.tl
    pointer = shipped(tl.pointer_type(tl.int8))
    found: dict[Any, Any] = {}  # Triton's scalar dtypes are equal, and hash, by name

    def np_dtype(tt_dtype: Any) -> Any:
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        try:
            return found[tt_dtype]
        except KeyError:
            found[tt_dtype] = answer = shipped(tt_dtype)  # a type it does not know raises here, as shipped
            return answer
        except TypeError:  # a type that does not hash: not a scalar dtype, asked each time
            return shipped(tt_dtype)

    return np_dtype


def dtypes_cached() -> bool:
    """Whether this process's Triton interpreter runs with `cache_np_dtypes` installed (imports nothing)."""
    return _replaced(_DTYPES)
