"""The imports tests.helpers.warm_app makes ahead of a warm start: which process made them (IMPORTED_BY), torch where
``WARM_TEST_TORCH=1``, a library that imports vllm if it can where ``WARM_TEST_OPTIONAL=1``
(tests.helpers.warm_optional), and a thread where ``WARM_TEST_THREAD=1`` (which a warm launcher must refuse to fork)."""

from __future__ import annotations

import os
import threading
import time

IMPORTED_BY = os.getpid()

if os.environ.get("WARM_TEST_TORCH") == "1":
    import torch  # noqa: F401, TID251 (a server's import, as in the workers)

if os.environ.get("WARM_TEST_OPTIONAL") == "1":
    from tests.helpers import warm_optional  # noqa: F401

if os.environ.get("WARM_TEST_THREAD") == "1":
    threading.Thread(target=time.sleep, args=(3600,), name="left-running", daemon=True).start()
