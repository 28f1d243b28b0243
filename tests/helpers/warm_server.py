"""``python -m tests.helpers.warm_server ARGS``: a server module for the warm-start tests, shaped as
specwake.worker.serve is: it runs another module (tests.helpers.warm_app) as ``__main__`` and names it in ``PRELOAD``,
for a warm launcher (specwake.worker.warm) to import ahead."""

from __future__ import annotations

import runpy

APP = "tests.helpers.warm_app"
PRELOAD = (APP,)

if __name__ == "__main__":
    runpy.run_module(APP, run_name="__main__", alter_sys=False)
