"""What vLLM answered about a scenario becomes one line naming the file and the key it is about
(specwake/prepare/validate.py check_answer); the answers here are vLLM's own texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.errors import ScenarioError
from specwake.prepare.scenario import load_scenario
from specwake.prepare.validate import check_answer
from tests.helpers.scenario_texts import MINIMAL

# vLLM's ModelConfig.verify_with_parallel_config, as SpeculativeConfig's drafter config raises it
HEADS = "Total number of attention heads (2) must be divisible by tensor parallel size (8)."


@pytest.mark.parametrize(
    ("text", "problem", "key"),
    [
        (MINIMAL.replace("[server]", "[server]\ntensor_parallel_size = 8"), HEADS, "server.tensor_parallel_size"),
        (MINIMAL + "draft_tensor_parallel_size = 8\n", HEADS, "speculative.draft_tensor_parallel_size"),
        (MINIMAL, "dspark_draft_topk is only supported by DSpark", "speculative"),
    ],
)
def test_a_refusal_of_speculative_config_names_the_key_it_is_about(
    tmp_path: Path, text: str, problem: str, key: str
) -> None:
    file = tmp_path / "s.toml"
    file.write_text(text)
    scenario = load_scenario(file)
    with pytest.raises(ScenarioError) as refused:
        check_answer(scenario, scenario.variants[0], {"vllm": "0.32.0", "semantic_problem": problem})
    assert str(refused.value) == f"{file}: {key}: vLLM 0.32.0's SpeculativeConfig refuses it: {problem}"
