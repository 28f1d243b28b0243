"""End to end on real vLLM CPU: two data-parallel engines, behind one API server, each engine's worker a process on a
core of its own (scenarios/cpu/dp-draft-model.toml), each behind a server of its own balanced by specwake
(scenarios/cpu/dp-external-deepseek-mtp.toml, vLLM's external load balancing), and across two nodes laid out on this
machine, the other node's engine headless (scenarios/cpu/dp-nodes-draft-model.toml); a server or node of one engine
runs its worker inside its engine core. Every engine is slept,
discarded, woken, reloaded and measured on its own requests, its AL read from vLLM's counters labelled by engine, its
workers' fingerprints read from each server or, behind one server, through the answer folder (vLLM's /collective_rpc
returns engine 0's alone). Stock vLLM collapses on both engines (one node), the reference fix recovers on both, and
a fix that reloads the drafter on engine 0 only must not pass: it collapses, engine 1 named, and engine 1's drafter
differs from fresh while engine 0's does not. In the session's shared run (tests/helpers/shared_runs.py). Skips only
when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.procs import require_module
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

SCENARIOS = Scenarios.shipped(
    "dp",
    "scenarios/cpu/dp-draft-model.toml",
    "scenarios/cpu/dp-external-deepseek-mtp.toml",
    "scenarios/cpu/dp-nodes-draft-model.toml",
    budget_s=4200,
)
INTERNAL, EXTERNAL, NODES = "cpu-dp-draft-model", "cpu-dp-external-deepseek-mtp", "cpu-dp-nodes-draft-model"
EVERY = pytest.mark.parametrize("scenario", [INTERNAL, EXTERNAL, NODES])
# each engine's outcome per variant (the other layouts leave stock vLLM on every engine to the one-node scenario)
ENGINE_OUTCOMES = {
    "baseline": {"0": "collapse", "1": "collapse"},
    "patched": {"0": "recover", "1": "recover"},
    "engine0-only": {"0": "recover", "1": "collapse"},
}
VARIANTS = [
    (s, name) for s in (INTERNAL, EXTERNAL, NODES) for name in ENGINE_OUTCOMES if s == INTERNAL or name != "baseline"
]
pytestmark = pytest.mark.shared_run(SCENARIOS)

require_module("vllm")


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def variant(run: dict[str, Any], scenario: str, name: str) -> dict[str, Any]:
    return next(v for v in run["results"][scenario]["variants"] if v["name"] == name)


@EVERY
def test_every_variant_meets_its_expectation_on_every_engine(run: dict[str, Any], scenario: str) -> None:
    result = run["results"][scenario]
    assert result["verdict"] == "pass" and result["complete"], outcome_note(run)
    assert run["leftovers"] == []
    ran = {v["name"]: v["engine_outcomes"] for v in result["variants"]}
    assert ran == {name: ENGINE_OUTCOMES[name] for (s, name) in VARIANTS if s == scenario}


@pytest.mark.parametrize(("scenario", "name"), VARIANTS)
def test_every_engine_is_measured_in_every_stage_and_its_workers_answer(
    run: dict[str, Any], scenario: str, name: str
) -> None:
    v = variant(run, scenario, name)
    assert sorted(w["engine"] for w in v["info"]["workers"]) == [0, 1]  # specwake_info from both engines
    # one engine a server or node: told "uni" (vLLM would start a process); two behind one: bound worker processes
    executor = "mp" if scenario == INTERNAL else "uni"
    assert [w["executor"] for w in v["info"]["workers"]] == [executor, executor]
    # every engine's process a copy of its server's or node's, vLLM imported once there (plan.START_METHOD)
    assert [w["started"] for w in v["info"]["workers"]] == ["fork", "fork"]
    for stage in v["stages"]:
        engines = {e["engine"]: e for e in stage["engines"]}
        assert sorted(engines) == ["0", "1"] and all(
            e["requests"] == 2 and e["num_drafts"] > 0 for e in engines.values()
        )
        assert sum(e["num_drafts"] for e in engines.values()) == stage["num_drafts"]  # the whole server's, split
        assert stage["requests"] == 4
        if stage["cycle"]:  # every request measured: each engine's AL is judged on its share
            assert "data parallel" in stage["stopped"] and stage["outputs_match_fresh"] is True
    for taken in v["diagnostics"]:
        if "fingerprints" in taken:
            assert taken["engines"] == [0, 1], taken["point"]


@EVERY
def test_a_drafter_reloaded_on_engine_0_only_is_named_by_its_engine(run: dict[str, Any], scenario: str) -> None:
    v = variant(run, scenario, "engine0-only")
    assert v["outcome"] == "collapse" and v["matched"]  # the scenario expects it: the partial fix must not pass
    after = v["stages"][1]
    al = {e["engine"]: e["acceptance_length"] for e in after["engines"]}
    assert al["0"] > 3.5 and al["1"] == 1.0
    (restore,) = [d for d in v["diagnostics"] if d["point"] == "after reload_weights"]
    engine0, engine1 = (fp["draft"] for fp in restore["fingerprints"])
    assert engine0["differ"] == 0 and engine1["differ"] > 0
    if scenario != EXTERNAL:  # the same engines' stock vLLM, on one node
        stock_diagnostics = variant(run, INTERNAL, "baseline")["diagnostics"]
        (stock,) = [d for d in stock_diagnostics if d["point"] == "after reload_weights"]
        # engine 1's drafter as stock vLLM leaves every engine's: the emulated discard's tensors still differ from fresh
        assert engine1["differ"] == stock["fingerprints"][1]["draft"]["differ"]
    else:  # as stock vLLM leaves an MTP drafter: each tensor of its own still the discard's zeros, differing from
        # fresh; only those it shares with the target (restored by the target's reload) are fresh again
        own = engine1["tensors"] - engine1["shared_with_target"]
        assert engine1["differ"] == engine1["all_zero"] == own > 0
    report = (run["dir"] / scenario / "report.md").read_text()
    assert "engine 1 of 2: AL" in report and "engine 0: recover" in report
    assert "engine 1 rank 0:" in report  # the weights line names the engine whose drafter differs


@pytest.mark.parametrize("name", ["patched", "engine0-only"])
def test_each_engine_of_an_externally_balanced_variant_is_a_server_of_its_own(run: dict[str, Any], name: str) -> None:
    v = variant(run, EXTERNAL, name)
    servers = v["info"]["servers"]
    assert [s["argv"][s["argv"].index("--data-parallel-rank") + 1] for s in servers] == ["0", "1"]
    ports = {s["argv"][s["argv"].index("--data-parallel-rpc-port") + 1] for s in servers}
    assert len(ports) == 1 and ports != {"0"}  # one group, met on a port picked at launch
    for server in servers:  # each server's own log, its engine's lines in it
        log = Path(server["log"]).read_text()
        assert "EngineCore_DP" in log and "--data-parallel-rank" in log.splitlines()[1]
    assert v["log_path"] == servers[0]["log"]


@pytest.mark.parametrize("name", ["patched", "engine0-only"])
def test_the_other_nodes_engine_runs_headless_started_by_the_node_command(run: dict[str, Any], name: str) -> None:
    v = variant(run, NODES, name)
    head, node = v["info"]["servers"]
    assert "launch" not in head and node["launch"] == node["argv"]  # node_command ["{argv}"]: its own words
    assert "--headless" in node["argv"] and node["argv"][node["argv"].index("--node-rank") + 1] == "1"
    for shared in ("--data-parallel-rpc-port", "--master-port"):  # picked at launch, the same for both
        port = head["argv"][head["argv"].index(shared) + 1]
        assert port != "0" and node["argv"][node["argv"].index(shared) + 1] == port
    log = Path(node["log"]).read_text()
    assert "EngineCore_DP1" in log and "in headless mode" in log  # engine 1 ran there
    assert "EngineCore_DP1" not in Path(head["log"]).read_text()  # not behind the head's server


def test_vllm_checked_every_data_parallel_variant_before_the_run(run: dict[str, Any]) -> None:
    """check builds each variant's engine config with vLLM; a multi-node group's ports are picked only at launch, so
    the check puts a valid port in their place (vLLM refuses 0) and no variant goes unchecked."""
    assert "engine config does not build here" not in run["proc"].stderr, run["proc"].stderr[-3000:]
