"""``python -m tests.helpers.import_facts``: imports vLLM's API server module as a CPU server's launcher does
(specwake.worker.serve first, for its side effects; the server module named in ``PRELOAD`` for a warm launcher to
import ahead), then prints one ``import-facts {...}`` line about what the imports left in the process, and exits. The
e2e warm-start test holds a server forked from a base's branch to a cold start by it."""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

from specwake.worker.serve import SERVER_MODULE

PRELOAD = (SERVER_MODULE,)


def config(name: str) -> dict[str, str] | None:
    """A torch config module's settings (their reprs, a set's sorted), where the imports imported it."""
    module = sys.modules.get(name)
    if module is None:
        return None
    return {
        k: repr(sorted(v, key=repr) if isinstance(v, set | frozenset) else v)
        for k, v in module.get_config_copy().items()
    }


def facts() -> dict[str, Any]:
    import torch  # noqa: TID251 (imported by the server module already)
    import vllm  # noqa: TID251 (the server's, this is its interpreter)

    return {
        "modules": sorted(sys.modules),
        "env": dict(os.environ),
        "sys_path": sys.path[1:],
        "vllm": vllm.__file__,
        "torch_threads": torch.get_num_threads(),
        "inductor": config("torch._inductor.config"),
        "dynamo": config("torch._dynamo.config"),
    }


if __name__ == "__main__":
    importlib.import_module(SERVER_MODULE)
    print(f"import-facts {json.dumps(facts())}", flush=True)
