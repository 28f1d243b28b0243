"""The K a batch-size schedule leaves in force, as the validation program (specwake.worker.validate) reads it in the
installed vLLM: with data parallelism vLLM's engine config drops the schedule (VllmConfig's SCHEDULE_DROP, pinned
against each release's source in tests/e2e/test_releases.py) and every batch size drafts num_speculative_tokens."""

from __future__ import annotations

from pathlib import Path

from specwake.prepare.scenario import load_scenario
from specwake.prepare.validate import request_for
from specwake.protocol import SCHEDULE_FIELD
from tests.helpers.procs import require_module
from tests.helpers.scenario_texts import MINIMAL

require_module("vllm")

from specwake.worker.validate import answer  # noqa: E402

SCHEDULE = "num_speculative_tokens_per_batch_size = [[1, 2, 0], [3, 16, 3]]\n"  # K 0 at one request at a time


def speculation(tmp_path: Path, server: str) -> dict:
    """What the validation program answers for MINIMAL with SCHEDULE and `server` keys, asked as `check` asks it."""
    file = tmp_path / "s.toml"
    file.write_text(MINIMAL.replace("[server]\n", f"[server]\n{server}") + SCHEDULE)
    scenario = load_scenario(file)
    request = request_for(scenario, scenario.variants[0], "some/target", "some/drafter")
    assert request["speculative"][SCHEDULE_FIELD] == [[1, 2, 0], [3, 16, 3]]
    return answer(request, "installed")["speculation"]


def test_one_engine_drafts_the_schedules_k_a_data_parallel_group_num_speculative_tokens(tmp_path: Path) -> None:
    alone = speculation(tmp_path, "")
    assert alone["k_in_force"] == 0 and alone["schedule_dropped"] is None
    group = speculation(tmp_path, "data_parallel_size = 2\n")
    assert group["k_in_force"] == 3 and group["schedule_dropped"] == "data_parallel_size 2"
    # replicas are servers of one engine each: each keeps the schedule
    replicas = speculation(tmp_path, 'data_parallel_size = 2\nload_balancing = "replicas"\n')
    assert replicas["k_in_force"] == 0 and replicas["schedule_dropped"] is None
