"""Data parallelism (server.data_parallel_size): every engine measured on its own requests and judged by its own
counters, every engine's workers heard, the variant as good as its worst engine, and the partial fix this is built
to catch — a drafter reloaded on engine 0 only — named by engine. Against the in-memory vLLM, whose engines keep
their own counters (labelled engine="i") and serve the requests routed to them by X-data-parallel-rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specwake.errors import RequestFailed, ScenarioError
from specwake.judge.verdict import engine_stages, worst
from specwake.prepare.engine import EngineInfo
from specwake.prepare.plan import EXECUTOR_FLAG, MULTIPROCESSING, build_server_command, build_server_env
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant, platform_problem
from specwake.report.explain import explain
from specwake.report.weights import memory_line, weights_line
from specwake.results import Diagnostic, StageResult, from_dict, to_dict
from specwake.run.measure.client import VllmClient
from specwake.run.measure.completions import Completer
from specwake.run.measure.cycle import run_cycle
from specwake.run.measure.diagnose import Fanout
from specwake.run.measure.measure import Stopping, Workload, run_stage, stage_name
from specwake.run.measure.metrics import engine_deltas, parse_spec_counters
from specwake.run.session.assemble import VariantRecord, judge_scenario, judge_variant
from specwake.run.session.check import measurement_plan
from tests.helpers.mock_vllm import MockVllm
from tests.helpers.scenario_texts import MINIMAL

ENGINE = EngineInfo("/py", "3.11", "0.32.0", Path("/pkg/vllm"), ("vllm==0.32.0",), "cpu", False, None, 0, 2)
DP2 = MINIMAL.replace("[server]\n", "[server]\ndata_parallel_size = 2\n")
WORKLOAD = Workload("m", ("alpha", "beta"), 8, repeats=4, warmup=1, temperature=0.0, ignore_eos=True,
                    request_timeout_s=5, engines=2)  # fmt: skip


def load(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "dp.toml"
    path.write_text(text)
    return load_scenario(path)


# -- the scenario and the server ---------------------------------------------------------------------------------------


def command(s: Scenario, is_gpu: bool = False) -> list[str]:
    return build_server_command(
        s, s.variants[0], python="/py", port=1, model="/m", draft_model="/d", sleep_mode=False, is_gpu=is_gpu
    )


def cpu_env(s: Scenario, cpu_ids: tuple[int, ...] = (0, 1)) -> dict[str, str]:
    return build_server_env(s, s.variants[0], base_env={}, pythonpath=["/src"], is_gpu=False, cpu_ids=list(cpu_ids))[1]


def test_a_dp_server_gets_its_flag_and_its_engines_worker_processes_each_bound_to_its_core(tmp_path: Path) -> None:
    s = load(tmp_path, DP2)
    argv = command(s)
    assert argv[argv.index("--data-parallel-size") + 1] == "2" and "--enable-expert-parallel" not in argv
    # two engines share the server's cores: only the multiprocessing executor binds each to a core of its own
    assert EXECUTOR_FLAG not in argv
    added = cpu_env(s)
    assert added["VLLM_CPU_OMP_THREADS_BIND"] == "0|1" and MULTIPROCESSING not in added  # vLLM: engine d, range d
    one = load(tmp_path, MINIMAL)
    assert cpu_env(one)[MULTIPROCESSING] == "0"  # one engine of one rank: its worker inside its engine core
    assert "--data-parallel-size" not in command(one) and EXECUTOR_FLAG not in command(one)  # world size 1: uni
    assert s.server.ranks == 2 and one.server.ranks == 1


def test_an_executor_of_the_scenarios_own_is_left_to_it(tmp_path: Path) -> None:
    chosen = load(
        tmp_path, MINIMAL.replace("[server]\n", "[server]\nargs = ['--distributed-executor-backend', 'mp']\n")
    )
    assert command(chosen).count(EXECUTOR_FLAG) == 1 and command(chosen)[-1] == "mp"  # theirs, once
    assert MULTIPROCESSING not in cpu_env(chosen)  # vLLM's CPU platform decides, as without specwake


def test_a_machine_with_fewer_gpus_than_engines_times_ranks_is_refused(tmp_path: Path) -> None:
    s = load(tmp_path, DP2.replace("[server]\n", "[server]\ntensor_parallel_size = 2\n"))
    gpus = EngineInfo("/py", "3.11", "0.33.0", Path("/pkg/vllm"), ("vllm==0.33.0",), "cuda", True, None, 3, 8)
    assert platform_problem(s, gpus, None) == (
        f"{s.name}: tensor_parallel_size 2 × data_parallel_size 2 needs 4 GPUs, only 3 available"
    )
    assert platform_problem(s, gpus, [0, 1, 2, 3]) is None  # --gpus names four


@pytest.mark.parametrize(
    ("text", "key", "phrase"),
    [
        (DP2.replace("[server]\n", "[server]\nargs = ['-dp', '2']\n"), "server.args", "use server.data_parallel_size"),
        (DP2 + "[workload]\nrepeats = 1\n", "workload.repeats", "cannot reach each of the 2 engines"),
        (MINIMAL.replace("[server]\n", "[server]\ndata_parallel_size = 0\n"), "server.data_parallel_size", ""),
    ],
)
def test_a_dp_scenario_that_cannot_judge_every_engine_is_refused(
    tmp_path: Path, text: str, key: str, phrase: str
) -> None:
    with pytest.raises(ScenarioError) as refused:
        load(tmp_path, text)
    assert key in str(refused.value) and phrase in str(refused.value)


# -- measured per engine -----------------------------------------------------------------------------------------------


def stage(server: MockVllm, cycle: int = 0, fresh: Any = None) -> tuple[StageResult, Any]:
    http = server.client()
    return run_stage(
        VllmClient(http), Completer(http), WORKLOAD, name=stage_name(cycle), cycle=cycle,
        fresh=fresh[0] if fresh else None, fresh_completions=fresh[1] if fresh else (), stopping=Stopping(0.05),
    )  # fmt: skip


def test_counters_are_read_per_engine_and_summed() -> None:
    server = MockVllm(engines=2)
    before = parse_spec_counters(server.model.metrics_text())
    server.model.complete("alpha", 8, on=1)
    after = parse_spec_counters(server.model.metrics_text())
    deltas = engine_deltas(before, after)
    assert sorted(deltas) == ["0", "1"] and deltas["0"].num_drafts == 0 and deltas["1"].num_drafts > 0
    assert after.drafts == sum(e.drafts for e in after.engines.values())
    assert parse_spec_counters(MockVllm().model.metrics_text()).engines == {}  # one engine: nothing per engine


def test_every_engine_gets_its_share_of_every_stage_and_its_own_al() -> None:
    server = MockVllm(engines=2, reload_restores_draft=True, restores_draft_on={0})  # the partial fix
    fresh = stage(server)
    assert [(e.engine, e.requests) for e in fresh[0].engines] == [("0", 2), ("1", 2)]
    assert all(e.acceptance_length == pytest.approx(4.0) for e in fresh[0].engines)
    run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    after = stage(server, 1, fresh)[0]
    by_engine = {e.engine: e.acceptance_length for e in after.engines}
    assert by_engine["0"] == pytest.approx(4.0) and by_engine["1"] == pytest.approx(1.0)
    assert after.requests == 4 and after.stopped is not None and "data parallel" in after.stopped
    assert after.acceptance_length is not None and 1.0 < after.acceptance_length < 4.0  # the sum hides engine 1


# -- judged per engine -------------------------------------------------------------------------------------------------


def judged(tmp_path: Path, restores_on: set[int] | None) -> Any:
    s = load(tmp_path, DP2 + "[variants.v]\n[expect]\nv = 'recover'\n")
    server = MockVllm(engines=2, reload_restores_draft=True, restores_draft_on=restores_on)
    fresh = stage(server)
    run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    after = stage(server, 1, fresh)[0]
    prep = PreparedVariant(s.variants[0], ENGINE, None, None, "/m", "/m", "emulated")
    # each engine's fingerprints after the reload: a drafter not reloaded differs from fresh in every tensor
    ranks = [{"target": {"tensors": 9, "compared": 9, "differ": 0},
              "draft": {"tensors": 7, "compared": 7, "differ": 0 if restores_on is None or e in restores_on else 7}}
             for e in (0, 1)]  # fmt: skip
    taken = Diagnostic.from_dict(
        {"cycle": 1, "point": "after reload_weights", "fingerprints": ranks, "engines": [0, 1]}
    )
    record = VariantRecord("v", "/logs/v.log", stages=[fresh[0], after], diagnostics=[taken], complete=True)
    return s, judge_variant(s, prep, record)


def test_a_drafter_reloaded_on_engine_0_only_collapses_with_engine_1_named(tmp_path: Path) -> None:
    s, v = judged(tmp_path, {0})
    assert v.engine_outcomes == {"0": "recover", "1": "collapse"} and v.outcome == "collapse" and not v.matched
    line = explain(v, s.tolerance)
    assert line.startswith("engine 1 of 2: AL 4.00 → 1.00") and "engine 0: recover, AL 4.00 → 4.00" in line
    result = judge_scenario(s, [v], "2026-12-03T00:00:00Z", complete=True, mode="sequential", host={})
    assert result.verdict == "fail" and from_dict(to_dict(result)).variants[0] == v  # kept in result.json


def test_the_full_fix_recovers_on_every_engine(tmp_path: Path) -> None:
    s, v = judged(tmp_path, None)
    assert v.engine_outcomes == {"0": "recover", "1": "recover"} and v.outcome == "recover" and v.matched
    assert explain(v, s.tolerance).startswith("engine 0 of 2: AL 4.00 → 4.00")


def test_the_worst_outcome_decides_and_an_engine_without_requests_has_no_al() -> None:
    assert worst(["recover", "degraded", "collapse"]) == "collapse" and worst(["recover", "crash"]) == "crash"
    fresh = StageResult("fresh", 0, 4.0, 10, 30, 30, [1.0] * 3, [1.0], 1.0, [8], ["x"], None)
    assert engine_stages([fresh], "3")[0].acceptance_length is None and engine_stages([fresh], "3")[0].num_drafts == 0


# -- every engine's workers heard --------------------------------------------------------------------------------------


class AnsweringEngines:
    """vLLM's /collective_rpc under data parallelism: every engine's workers run the method and leave their answers
    where they are told (as specwake's worker extension does), the HTTP answer carries engine 0's alone."""

    def __init__(self, answering: list[int], ranks: int = 1) -> None:
        self.answering, self.ranks = answering, ranks

    def rpc_results(self, method: str, *, timeout: float, kwargs: dict[str, Any] | None = None) -> list[Any]:
        folder = Path((kwargs or {})["answer_dir"])
        for engine in self.answering:
            for rank in range(self.ranks):
                answer = {"draft": {"tensors": 7, "compared": 7, "differ": 7 * engine}, "target": {"tensors": 9}}
                (folder / f"{engine}-{rank}.json").write_text(json.dumps({"engine": engine, "rank": rank,
                                                                          "answer": answer}))  # fmt: skip
        return [{"only": "engine 0"}]


def test_every_engine_answers_through_its_files_and_a_silent_engine_is_named(tmp_path: Path) -> None:
    fanout = Fanout(2, tmp_path / "v.answers")
    answers, engines = fanout.results(AnsweringEngines([1, 0], ranks=2), "specwake_fingerprint", timeout=5)  # type: ignore[arg-type]
    assert engines == (0, 0, 1, 1) and [a["draft"]["differ"] for a in answers] == [0, 0, 7, 7]
    assert list((tmp_path / "v.answers").iterdir()) == []  # each call's folder removed once read
    taken = Diagnostic.from_dict({"cycle": 1, "point": "after reload_weights", "fingerprints": answers,
                                  "engines": list(engines)})  # fmt: skip
    assert taken.rank_names() == ["engine 0 rank 0", "engine 0 rank 1", "engine 1 rank 0", "engine 1 rank 1"]
    assert weights_line([taken], "draft") == (
        "draft: engine 0 rank 0: 0/7 tensors differ from fresh, engine 0 rank 1: 0/7 tensors differ from fresh,"
        " engine 1 rank 0: 7/7 tensors differ from fresh, engine 1 rank 1: 7/7 tensors differ from fresh after"
        " reload_weights in cycle 1"
    )
    with pytest.raises(RequestFailed, match=r"no answer from engine\(s\) \[1\] of 2"):
        fanout.results(AnsweringEngines([0]), "specwake_fingerprint", timeout=5)  # type: ignore[arg-type]


def test_memory_and_an_engines_own_answers_are_named_by_engine() -> None:
    memory = [{"device": "cuda:0", "free_bytes": free, "total_bytes": 100 * 1024**3} for free in (10 * 1024**3,) * 2]
    asleep = [{"device": "cuda:0", "free_bytes": 70 * 1024**3, "total_bytes": 100 * 1024**3}] * 2
    awake = [{"device": "cuda:0", "free_bytes": 20 * 1024**3, "total_bytes": 100 * 1024**3}] * 2
    taken = [
        Diagnostic.from_dict({"cycle": 1, "point": point, "memory": m, "engines": [0, 1]})
        for point, m in (("before sleep", memory), ("after sleep", asleep), ("after wake_kv_cache", awake))
    ]
    assert memory_line(taken) == (
        "device memory: engine 0 rank 0: 60.00 GiB freed by sleep, 50.00 GiB restored by wake;"
        " engine 1 rank 0: 60.00 GiB freed by sleep, 50.00 GiB restored by wake"
    )
    one = taken[0].of_engine(1)
    assert one.engines == (1,) and len(one.memory) == 1


@pytest.mark.parametrize(
    "args", ["['--distributed-executor-backend', 'ray']", "['--distributed-executor-backend=ray']"]
)
def test_check_says_vllm_cpu_cannot_run_the_ray_executor(tmp_path: Path, args: str) -> None:
    s = load(tmp_path, DP2.replace("[server]\n", f"[server]\nargs = {args}\n"))
    assert "does not support ray" in (platform_problem(s, ENGINE, None) or "")
    gpus = EngineInfo("/py", "3.11", "0.33.0", Path("/pkg/vllm"), ("vllm==0.33.0",), "cuda", True, None, 8, 8)
    assert platform_problem(s, gpus, None) is None  # on GPUs, Ray is the user's cluster to bring
    assert platform_problem(load(tmp_path, DP2), ENGINE, None) is None


def test_check_and_the_report_say_every_request_is_measured_with_data_parallelism(tmp_path: Path) -> None:
    s = load(tmp_path, DP2 + "[variants.v]\n")
    prep = PreparedVariant(s.variants[0], ENGINE, None, None, "/m", "/m", "emulated")
    assert "in turn to the 2 engines (every one, no early stop)" in "\n".join(measurement_plan(s, [prep]))
