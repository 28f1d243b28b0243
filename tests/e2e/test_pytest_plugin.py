"""specwake's pytest plugin on real vLLM CPU, the way vLLM's nightly would call it: `pytest -v
scenarios/cpu/draft-model.toml --junitxml FILE` (one cycle), stock vLLM against the reference fix, here on two
pytest-xdist workers (`-n 2`: one item each). Each variant is an item with its verdict; the scenario runs once; pytest's
own JUnit carries the figures, and each item's time is its variant's. Skips only when vLLM is missing and
SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from specwake.runfolder import load_result
from tests.helpers.paths import REPO
from tests.helpers.procs import launch_env, require_module

require_module("vllm")

RUN_S = 900  # the pytest run of the scenario, both servers side by side
pytestmark = pytest.mark.timeout(RUN_S + 300)  # the run's own limit fires first, with its message


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("plugin")
    junit = tmp / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "xdist", "-n", "2", "-v",
         "scenarios/cpu/draft-model.toml", "-k", "not preserve and not 0.34 and not v1",  # stock vLLM and the fix
         "--junitxml", str(junit), "--specwake-output", str(tmp / "out"), "--specwake-cycles", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_S, stdin=subprocess.DEVNULL, env=launch_env(),
    )  # fmt: skip
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")} if junit.is_file() else {}
    return {"proc": proc, "cases": cases, "out": tmp / "out"}


def test_stock_vllm_and_the_fix_pass_as_items(session: dict[str, Any]) -> None:
    proc = session["proc"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "PASSED scenarios/cpu/draft-model.toml::baseline" in proc.stdout
    assert "PASSED scenarios/cpu/draft-model.toml::patched" in proc.stdout
    assert "[gw0]" in proc.stdout and "[gw1]" in proc.stdout  # an item on each worker
    [run] = session["out"].iterdir()  # one run for both items
    assert sorted(v.name for v in load_result(run).variants) == ["baseline", "patched"]


def test_each_items_time_is_its_variants(session: dict[str, Any]) -> None:
    [run] = session["out"].iterdir()
    for variant in load_result(run).variants:
        # JUnit adds the item's setup and teardown, pytest's own few ms (17 ms seen under the suite's load); the run
        # of the whole scenario, which the first item waited for, is a minute more
        assert abs(float(session["cases"][variant.name].get("time")) - variant.seconds) < 0.5


def test_pytests_junit_carries_the_figures(session: dict[str, Any]) -> None:
    props = {
        name: {p.get("name"): p.get("value") for p in case.iter("property")} for name, case in session["cases"].items()
    }
    assert props["baseline"]["outcome"] == "collapse" and props["patched"]["outcome"] == "recover"
    assert props["baseline"]["al_fresh"] == "4.0" and props["baseline"]["al_after_cycle_1"] == "1.0"
    assert props["patched"]["al_after_cycle_1"] == "4.0"
    assert "al_after_cycle_2" not in props["patched"]  # --specwake-cycles 1 reached the run
    assert float(props["patched"]["wake_seconds"]) > 0
