"""One server per engine (server.load_balancing "external" or "replicas"): specwake is the balancer. Each server is
started as its engine, every control call reaches each, engine i's requests go to server i, the counters of all are
summed with engine i server i's, and every server's workers are heard. Against in-memory vLLM servers of one engine
each; the real two-server run is tests/e2e/test_data_parallel.py."""

from __future__ import annotations

import shlex
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from specwake.errors import ScenarioError
from specwake.prepare.overlay import Overlay
from specwake.prepare.plan import PORT_UNSET, build_server_command, build_server_env
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant, overlay_under_ray, plan_servers, plan_variant
from specwake.results import StageResult
from specwake.run.measure.client import FannedClient, VllmClient
from specwake.run.measure.completions import Completer, FannedCompleter
from specwake.run.measure.cycle import run_cycle
from specwake.run.measure.diagnose import Fanout
from specwake.run.measure.measure import Stopping, Workload, run_stage, stage_name
from specwake.run.measure.metrics import parse_spec_counters, summed
from tests.helpers.mock_vllm import MockVllm
from tests.helpers.scenario_texts import MINIMAL
from tests.unit.test_data_parallel import ENGINE

WORKLOAD = Workload("m", ("alpha", "beta"), 8, repeats=4, warmup=1, temperature=0.0, ignore_eos=True,
                    request_timeout_s=5, engines=2)  # fmt: skip


def load(tmp_path: Path, balancing: str, extra: str = "") -> Scenario:
    path = tmp_path / "lb.toml"
    path.write_text(
        MINIMAL.replace("[server]\n", f'[server]\ndata_parallel_size = 2\nload_balancing = "{balancing}"\n') + extra
    )
    return load_scenario(path)


def argv_of(s: Scenario, replica: int) -> list[str]:
    return build_server_command(s, s.variants[0], python="/py", port=1, model="/m", draft_model="/d",
                                sleep_mode=False, is_gpu=False, replica=replica)  # fmt: skip


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# -- the scenario and its servers --------------------------------------------------------------------------------------


def test_external_balancing_starts_each_server_as_its_rank_of_one_group(tmp_path: Path) -> None:
    s = load(tmp_path, "external")
    assert s.server.servers == 2 and s.server.server_ranks == 1 and s.server.ranks == 2
    for rank in (0, 1):
        argv = argv_of(s, rank)
        assert flag(argv, "--data-parallel-size") == "2" and flag(argv, "--data-parallel-rank") == str(rank)
        assert flag(argv, "--data-parallel-address") == "127.0.0.1"
        assert flag(argv, "--data-parallel-rpc-port") == str(PORT_UNSET)
        # in a data-parallel group vLLM would pick a worker process: the engine's single rank is told "uni"
        assert flag(argv, "--distributed-executor-backend") == "uni"
    env, added = build_server_env(s, s.variants[0], base_env={}, pythonpath=["/src"], is_gpu=False, cpu_ids=[0, 1],
                                  cores=(1,))  # fmt: skip
    # the worker inside the engine core, held to the server's own core by its affinity (the binding is read by "mp")
    assert added["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "VLLM_CPU_OMP_THREADS_BIND" not in added


def test_replicas_are_independent_servers_without_data_parallel_flags(tmp_path: Path) -> None:
    s = load(tmp_path, "replicas")
    argv = argv_of(s, 1)
    assert not [a for a in argv if a.startswith("--data-parallel")]  # what vLLM asks of a dense model
    _, added = build_server_env(s, s.variants[0], base_env={}, pythonpath=["/src"], is_gpu=False, cpu_ids=[0, 1],
                                cores=(0,))  # fmt: skip
    assert added["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # a server of one engine and one rank, as any other


def test_each_server_takes_its_own_share_of_the_variants_cores_and_the_groups_port(tmp_path: Path) -> None:
    s = load(tmp_path, "external", "[variants.v]\n")
    prep = _prepared(s)
    plans = [plan_variant(s, prep, 0, (), (0, 1), r) for r in (0, 1)]
    assert [p.cores for p in plans] == [(0,), (1,)]
    launched = [p.with_port(4000 + r, {"--data-parallel-rpc-port": 5000}) for r, p in enumerate(plans)]
    assert [flag(p.argv, "--port") for p in launched] == ["4000", "4001"]
    assert {flag(p.argv, "--data-parallel-rpc-port") for p in launched} == {"5000"}  # one group, one meeting port


@pytest.mark.parametrize(
    ("text", "key", "phrase"),
    [
        (MINIMAL.replace("[server]\n", '[server]\nload_balancing = "external"\n'), "server", "set data_parallel_size"),
        (MINIMAL.replace("[server]\n", '[server]\nload_balancing = "round-robin"\n'), "server.load_balancing", ""),
        (MINIMAL.replace("[server]\n", "[server]\nargs = ['--data-parallel-rank', '1']\n"), "server.args",
         "use server.load_balancing"),
        (MINIMAL.replace("[server]\n", "[server]\nargs = ['-dpp=1234']\n"), "server.args",
         "use server.load_balancing"),
    ],
)  # fmt: skip
def test_a_balancing_that_cannot_run_is_one_line_naming_its_key(
    tmp_path: Path, text: str, key: str, phrase: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and key in message and phrase in message


# -- specwake as the balancer ------------------------------------------------------------------------------------------


def fanned(servers: list[MockVllm]) -> tuple[FannedClient, FannedCompleter]:
    https = [server.client() for server in servers]
    return FannedClient([VllmClient(h) for h in https]), FannedCompleter([Completer(h) for h in https])


def stage(client: FannedClient, completer: FannedCompleter, cycle: int = 0, fresh: Any = None) -> Any:
    return run_stage(
        client, completer, WORKLOAD, name=stage_name(cycle), cycle=cycle, fresh=fresh[0] if fresh else None,
        fresh_completions=fresh[1] if fresh else (), stopping=Stopping(0.05),
    )  # fmt: skip


def test_every_cycle_step_reaches_each_server_and_each_engine_is_judged_by_its_own_counters() -> None:
    # engine 1's server reloads the target only: its drafter keeps the discard
    servers = [MockVllm(reload_restores_draft=True), MockVllm(reload_restores_draft=False)]
    client, completer = fanned(servers)
    fresh = stage(client, completer)
    assert [(e.engine, e.requests) for e in fresh[0].engines] == [("0", 2), ("1", 2)]
    steps, fault = run_cycle(client, 1, level=2, emulate_discard=True, step_timeout_s=5)
    assert fault is None and all(step.ok for step in steps)
    # each server slept, discarded, woke, reloaded and reset its cache, in the cycle's order
    seen = [[c for c in s.calls if not c.startswith(("/metrics", "/v1/"))] for s in servers]
    assert seen[0] == seen[1] and len(seen[0]) == len(steps)
    assert [step.name for step in steps] == [c.split("?")[0].lstrip("/") for c in seen[0]] or "reload_weights" in seen[
        0
    ]
    after: StageResult = stage(client, completer, 1, fresh)[0]
    by_engine = {e.engine: e.acceptance_length for e in after.engines}
    assert by_engine["0"] == pytest.approx(4.0) and by_engine["1"] == pytest.approx(1.0)
    assert after.num_drafts == sum(e.num_drafts for e in after.engines)  # the variant's counters: both summed


def test_the_counters_of_several_servers_are_summed_engine_by_engine() -> None:
    one, two = MockVllm(), MockVllm()
    one.model.complete("alpha", 8)
    both = summed([parse_spec_counters(one.model.metrics_text()), parse_spec_counters(two.model.metrics_text())])
    assert sorted(both.engines) == ["0", "1"] and both.engines["1"].drafts == 0
    assert both.drafts == both.engines["0"].drafts > 0 and both.generation_tokens == 8


def test_a_control_call_one_server_refuses_is_the_answer_and_every_servers_workers_are_heard() -> None:
    servers = [MockVllm(), MockVllm(fail={"/wake_up": 500})]
    client, _ = fanned(servers)
    assert client.request("POST", "/wake_up", timeout=5).status == 500  # engine 1's refusal is not hidden
    assert "/wake_up" in servers[0].calls  # and engine 0 was asked all the same
    answers, engines = Fanout(2, None).results(client, "specwake_info", timeout=5)
    assert engines == (0, 1) and len(answers) == 2  # one worker each, engine i behind server i
    assert all("specwake_info" in s.calls for s in servers)


def _prepared(s: Scenario) -> PreparedVariant:
    return PreparedVariant(s.variants[0], ENGINE, None, None, "/m", "/m", "emulated")


def test_the_engines_of_one_group_are_asked_at_once() -> None:
    """vLLM's /sleep on one engine of a data-parallel group waits for the others: asked one server after the other,
    the first never answers. Each in-memory server here answers /sleep only once every server has been asked."""
    together = threading.Barrier(2, timeout=5)

    def group_member(server: MockVllm) -> httpx.Client:
        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/sleep":
                together.wait()  # BrokenBarrierError (an HTTP error to the client) when asked alone
            return server.handler(request)

        return httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(handler))

    client = FannedClient([VllmClient(group_member(MockVllm())) for _ in range(2)])
    assert client.request("POST", "/sleep", timeout=10, params=[("level", "2")]).ok


# -- engines on other nodes --------------------------------------------------------------------------------------------

NODES = '[server]\ndata_parallel_size = 4\nnodes = 2\nhead_address = "10.0.0.1"\nnode_command = {command}\n'


def nodes(tmp_path: Path, command: str = '["ssh", "-tt", "gpu-{node}", "{command}"]') -> Scenario:
    path = tmp_path / "nodes.toml"
    path.write_text(MINIMAL.replace("[server]\n", NODES.format(command=command)) + "[variants.v]\n")
    return load_scenario(path)


def test_the_head_serves_and_each_other_node_runs_its_share_of_the_engines_headless(tmp_path: Path) -> None:
    s = nodes(tmp_path)
    head, other = plan_servers(s, _prepared(s))
    assert s.server.ranks == 2  # this machine runs the head's two engines; the other node's are not its devices
    for plan in (head, other):  # vLLM infers each node's engines and their ranks from these (arg_utils.py)
        assert flag(plan.argv, "--data-parallel-size") == "4" and flag(plan.argv, "--nnodes") == "2"
        assert flag(plan.argv, "--master-addr") == "10.0.0.1"
    assert "--headless" not in head.argv and head.launch == [] and flag(head.argv, "--node-rank") == "0"
    assert "--headless" in other.argv and flag(other.argv, "--node-rank") == "1"
    ssh, tt, host, command = other.launch
    assert (ssh, tt, host) == ("ssh", "-tt", "gpu-1")
    words = shlex.split(command)  # one shell string for ssh: the environment specwake sets, then the argv
    assert words[0] == "env" and f"PYTHONPATH={other.env_added['PYTHONPATH']}" in words
    assert words[words.index("env") + len(other.env_added) + 1 :] == other.argv
    launched = other.with_port(0, {"--data-parallel-rpc-port": 5555, "--master-port": 5556})
    # the group's ports, picked at launch, in the command
    assert "--master-port 5556" in launched.launch[-1] and "--data-parallel-rpc-port 5555" in launched.launch[-1]


def test_nodes_run_here_take_their_own_cores(tmp_path: Path) -> None:
    s = nodes(tmp_path, '["{argv}"]')
    assert s.server.ranks == 4 and s.server.server_ranks == 2
    head, other = plan_servers(s, _prepared(s), cores=(0, 1, 2, 3))
    assert (head.cores, other.cores) == ((0, 1), (2, 3)) and other.launch == other.argv
    # two engines a node share its cores: worker processes, each engine's bound to its own (CPU, this machine)
    assert flag(head.argv, "--distributed-executor-backend") is None
    path = tmp_path / "two.toml"
    path.write_text(s.file.read_text().replace("data_parallel_size = 4", "data_parallel_size = 2"))
    one = load_scenario(path)
    head, other = plan_servers(one, _prepared(one), cores=(0, 1))
    assert one.server.server_ranks == 1  # one engine a node: its worker inside its engine core, on the node's core
    assert [flag(p.argv, "--distributed-executor-backend") for p in (head, other)] == ["uni", "uni"]


@pytest.mark.parametrize(
    ("server", "phrase"),
    [
        ("data_parallel_size = 3\nnodes = 2\nnode_command = ['{argv}']\n", "= 3 ranks evenly"),
        ("data_parallel_size = 2\nnodes = 2\n", 'e.g. ["ssh", "-tt", "gpu-{node}", "{command}"]'),
        ("data_parallel_size = 2\nnodes = 2\nnode_command = ['ssh', 'gpu-1']\n", "nothing would run vLLM"),
        ("node_command = ['{argv}']\n", "only with nodes above 1"),
        ("args = ['--headless']\n", "use server.nodes"),
        ("args = ['--node-rank=1']\n", "use server.nodes"),
    ],
)
def test_nodes_that_cannot_run_are_one_line_naming_the_key(tmp_path: Path, server: str, phrase: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(MINIMAL.replace("[server]\n", "[server]\n" + server))
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert len(str(caught.value).splitlines()) == 1 and phrase in str(caught.value)


def test_check_says_how_a_patched_variants_overlay_reaches_rays_workers(tmp_path: Path) -> None:
    path = tmp_path / "ray.toml"
    path.write_text(MINIMAL.replace("[server]\n", "[server]\nargs = ['--distributed-executor-backend', 'ray']\n")
                    + "[variants.v]\n")  # fmt: skip
    s = load_scenario(path)
    overlay = Overlay(tmp_path / "overlay", ("vllm/x.py",), (), "abc", False)
    patched = PreparedVariant(s.variants[0], ENGINE, overlay, None, "/m", "/m", "emulated")
    note = overlay_under_ray(s, patched)
    assert note is not None and f"PYTHONPATH={tmp_path / 'overlay'}:" in note and "'overlay not used'" in note
    assert overlay_under_ray(s, _prepared(s)) is None  # stock vLLM: nothing to carry
