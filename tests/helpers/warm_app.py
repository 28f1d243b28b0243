"""What tests.helpers.warm_server runs: one ``warm-app {...}`` line about the process it runs in (for the warm-start
tests to read from the server's log), then tests/helpers/fake_server.py's server. Where ``WARM_TEST_OVERLAY=1`` it
imports a package named vllm, as a server does: the test's overlays each hold one that says which it is (WHERE)."""

from __future__ import annotations

import json
import os
import sys

from tests.helpers import warm_imports
from tests.helpers.fake_server import main

if os.environ.get("WARM_TEST_OVERLAY") == "1":
    import vllm  # noqa: F401, TID251 (the overlay's, on PYTHONPATH)

if __name__ == "__main__":
    torch = sys.modules.get("torch")
    facts = {
        "pid": os.getpid(),
        "sid": os.getsid(0),
        "imported_by": warm_imports.IMPORTED_BY,
        "cpus": sorted(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "value": os.environ.get("WARM_TEST_VALUE"),
        "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
        "argv": sys.argv[1:],
        "overlay": getattr(sys.modules.get("vllm"), "WHERE", None),
        "optional": getattr(sys.modules.get("tests.helpers.warm_optional"), "HAS_VLLM", None),
    }
    print(f"warm-app {json.dumps(facts)}", flush=True)
    main()
