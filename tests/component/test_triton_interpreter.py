"""Triton's interpreter as a CPU server on Model Runner V2 runs it (specwake/worker/triton_cpu.py), with
triton.language's interpreted builtins swapped in once instead of at every launch: the same values as the interpreter
as shipped, on a program with a masked load and store, a branch-free select and a nested @triton.jit helper (the
interpreter's second path into the swap), one walk of the language modules in all instead of several a launch, and
the shipped interpreter back under SPECWAKE_TRITON_PATCH_ONCE=0 or where Triton has no `_patch_lang` to replace. Each
program runs in a fresh interpreter, since Triton reads TRITON_INTERPRET when a program is decorated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from specwake.prepare.plan import TRITON_INTERPRET, TRITON_ON_CPU
from specwake.worker.triton_cpu import PATCH_ONCE
from tests.helpers.procs import require_module

require_module("triton")

PROGRAM = """
import inspect, json, sys
from specwake.worker.triton_cpu import dtypes_cached, interpret_triton_on_cpu, language_kept
interpret_triton_on_cpu()
import torch, triton, triton.language as tl
from triton.runtime import interpreter

walks = 0
walk = inspect.getmembers
def counted(*args, **kwargs):
    global walks
    walks += 1
    return walk(*args, **kwargs)
inspect.getmembers = counted  # the interpreter's swap walks each language module with it

@triton.jit
def _twice_plus_one(x):
    return x * 2 + 1

@triton.jit
def _kernel(src, dst, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + i, mask=i < n, other=0.0)
    tl.store(dst + i, tl.where(x > 0, _twice_plus_one(x), -x), mask=i < n)

src = torch.randn(100, generator=torch.Generator().manual_seed(0))
values, walked = [], []
for _ in range(3):
    dst = torch.full((100,), 7.0)
    _kernel[(4,)](src, dst, 100, BLOCK=32)
    values.append(dst.tolist())
    walked.append(walks)
expected = torch.where(src > 0, src * 2 + 1, -src).tolist()
print(json.dumps({"values": values, "expected": expected, "walked": walked, "kept": language_kept(),
                  "cached": dtypes_cached()}))
"""


def interpreted(**env: str) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if k not in (TRITON_ON_CPU, TRITON_INTERPRET, PATCH_ONCE)}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=base | {TRITON_ON_CPU: "1"} | env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    return {"kept": interpreted(), "shipped": interpreted(**{PATCH_ONCE: "0"})}


def test_kept_and_shipped_compute_the_same_values(runs: dict[str, dict[str, Any]]) -> None:
    kept, shipped = runs["kept"], runs["shipped"]
    assert kept["values"] == shipped["values"]
    assert kept["values"][0] == pytest.approx(kept["expected"], rel=1e-6)
    assert kept["values"][0] == kept["values"][1] == kept["values"][2]


def test_the_language_is_walked_once_in_all_instead_of_at_every_launch(runs: dict[str, dict[str, Any]]) -> None:
    kept, shipped = runs["kept"], runs["shipped"]
    assert kept["kept"] is True and shipped["kept"] is False
    assert kept["walked"][0] > 0 and kept["walked"] == [kept["walked"][0]] * 3  # the first launch's swap, no other
    first, second, third = shipped["walked"]
    assert second - first == third - second == first > kept["walked"][0]  # every launch walks again, nested too


def test_dtype_lookups_are_cached_only_where_the_language_is_kept(runs: dict[str, dict[str, Any]]) -> None:
    assert runs["kept"]["cached"] is True and runs["shipped"]["cached"] is False


DTYPES = """
import json, os
os.environ["TRITON_INTERPRET"] = "1"
from triton.runtime import interpreter
import triton.language as tl
shipped = interpreter._get_np_dtype
from specwake.worker.triton_cpu import cache_np_dtypes, dtypes_cached
installed = cache_np_dtypes()
cached = interpreter._get_np_dtype
scalars = [value for value in vars(tl).values() if isinstance(value, tl.dtype) and not isinstance(value, tl.block_type)]
types = scalars + [tl.pointer_type(t) for t in scalars] + [tl.block_type(t, [4, 2]) for t in scalars]
types += [tl.block_type(tl.pointer_type(tl.float32), [8])]
def answer(get, tt):
    try:
        return str(get(tt))
    except Exception as exc:
        return type(exc).__name__
print(json.dumps({"installed": installed, "cached": dtypes_cached(), "n": len(types),
                  "same": [answer(shipped, t) == answer(cached, t) == answer(cached, t) for t in types],
                  "known": sum(answer(shipped, t) not in ("KeyError", "TypeError") for t in types)}))
"""


def test_every_triton_type_gets_the_shipped_dtype_from_the_table() -> None:
    """Each scalar dtype triton.language defines, a pointer to it and a block of it: the cached lookup answers, twice,
    what the shipped function answers, raising where it raises."""
    done = subprocess.run([sys.executable, "-c", DTYPES], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["installed"] is True and found["cached"] is True
    assert found["n"] > 40 and found["known"] > 30 and all(found["same"])


def test_a_triton_without_the_function_is_left_as_shipped() -> None:
    program = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "from triton.runtime import interpreter\n"
        "from specwake.worker.triton_cpu import patch_language_once, language_kept\n"
        "del interpreter._patch_lang\n"
        "print(patch_language_once(), language_kept(), hasattr(interpreter, '_patch_lang'))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["False", "False", "False"]
