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


# vLLM 0.32's SpeculativeMethod, as its validation program reads it from the Literal types (a few of its 39 names)
METHODS = ["ngram", "medusa", "draft_model", "eagle", "eagle3", "deepseek_mtp", "mimo_mtp", "mtp", "dflash", "dspark"]


@pytest.mark.parametrize(
    ("method", "hint"),
    [
        ("draft-model", "(did you mean 'draft_model'?)"),
        ("eagle_3", "(did you mean 'eagle3'?)"),
        ("frobnicate", "(nearest: "),
    ],
)
def test_an_unknown_method_gets_a_did_you_mean_not_every_name(tmp_path: Path, method: str, hint: str) -> None:
    file = tmp_path / "s.toml"
    file.write_text(MINIMAL.replace('method = "draft_model"', f'method = "{method}"'))
    scenario = load_scenario(file)
    answer = {"vllm": "0.32.0", "bad_values": {"method": "Input should be " + ", ".join(map(repr, METHODS))}}
    with pytest.raises(ScenarioError) as refused:
        check_answer(scenario, scenario.variants[0], answer | {"choices": {"method": METHODS}})
    said = str(refused.value)
    assert said.startswith(f"{file}: speculative.method: vLLM 0.32.0: {method!r} is not one of its 10 choices {hint}")
    assert said.count("'") <= 8 and len(said) < len(str(file)) + 130, said  # at most three names, not the list


def test_the_validation_program_reads_every_name_of_nested_literals() -> None:
    """vLLM's `method: SpeculativeMethod | None`, SpeculativeMethod a Literal of Literals (config/speculative.py)."""
    from typing import Literal, Optional

    from specwake.worker.validate import literal_choices

    mtp = Literal["deepseek_mtp", "mtp"]
    eagle = Literal["eagle", "eagle3", mtp]
    assert literal_choices(Optional[Literal["ngram", "draft_model", eagle]]) == [  # noqa: UP045 (vLLM's own form)
        "ngram",
        "draft_model",
        "eagle",
        "eagle3",
        "deepseek_mtp",
        "mtp",
    ]
