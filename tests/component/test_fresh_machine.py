"""The unit tier on a machine where nothing has run before: no matplotlib font cache, an empty HOME. `make check`
must pass there too (matplotlib's first use lists fonts with a process, which the unit tier refuses in a test)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import REPO

# The unit modules that draw: the ones a warm font cache had been hiding.
PLOTTING = ["tests/unit/test_plot.py", "tests/unit/test_cli_outputs.py"]


def test_the_plotting_unit_tests_pass_with_empty_caches(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPL", "XDG_"))}
    env.update(HOME=str(home), MPLCONFIGDIR=str(tmp_path / "mpl"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLOTTING]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (tmp_path / "mpl").is_dir(), "matplotlib did not use the empty config folder: the test proved nothing"
