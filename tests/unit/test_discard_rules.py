"""The emulated Level-2 discard under each release's rules (specwake.worker.discard), on small torch modules: what
0.32/0.33 take (every parameter and plain attribute; buffers and preserved parameters written back by name) against
what 0.34 takes (only the storages of the parameters the update rewrites, with whatever shares them), and how
--sleep-preserve-parameter-names is matched (the drafter's own parameters as `draft.<name>`)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402

from specwake.protocol import DISCARD_RULES, release_rules  # noqa: E402
from specwake.worker.discard import RULES, emulate_discard  # noqa: E402
from specwake.worker.extension import SpecwakeWorkerExtension  # noqa: E402


class PackedLinear(torch.nn.Module):
    """A linear layer as vLLM's CPU build leaves it: the parameter emptied, the weight in a packed copy."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        packed = torch.full((3, 4), 2.0)
        self.cpu_linear = lambda x, weight, bias: x @ packed.T


class Target(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(6, 4)  # the drafter shares it
        self.proj = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        torch.nn.init.constant_(self.norm.bias, 0.5)  # no value is zero: a zero fill changes every one
        self.register_buffer("rope", torch.arange(1.0, 5.0))  # memory of its own
        self.register_buffer("bias_view", self.proj.bias.data)  # shares the storage of the parameter proj.bias
        self.alias = self.norm.weight.data  # a plain attribute aliasing a parameter
        self.fused = torch.cat([self.proj.weight, self.norm.weight[None]]).detach()  # derived, memory of its own


class Draft(torch.nn.Module):
    def __init__(self, embed: torch.nn.Embedding) -> None:
        super().__init__()
        self.embed = embed
        self.head = torch.nn.Linear(4, 6)
        self.head_t = self.head.weight.detach().t().contiguous()  # derived from head.weight, memory of its own
        self.packed = PackedLinear()


def models() -> dict[str, Any]:
    torch.manual_seed(0)
    target = Target()
    return {"target": target, "draft": Draft(target.embed)}


def zero(tensor: torch.Tensor) -> bool:
    return not bool(tensor.any())


def same(tensor: torch.Tensor, fresh: torch.Tensor) -> bool:
    return torch.equal(tensor, fresh)


def snapshot(found: dict[str, Any]) -> dict[str, torch.Tensor]:
    target, draft = found["target"], found["draft"]
    tensors = {
        "proj.bias": target.proj.bias, "norm.weight": target.norm.weight, "rope": target.rope,
        "bias_view": target.bias_view, "alias": target.alias, "fused": target.fused, "embed": target.embed.weight,
        "head.weight": draft.head.weight, "head_t": draft.head_t,
    }  # fmt: skip
    return {name: t.detach().clone() for name, t in tensors.items()}


def packed_discarded(draft: Draft) -> bool:
    return zero(draft.packed.cpu_linear(torch.ones(1, 4), draft.packed.weight, None))


def test_the_rules_are_the_ones_the_protocol_names() -> None:
    assert tuple(RULES) == DISCARD_RULES == ("0.33", "0.34")
    assert [release_rules(v) for v in ("0.32.0", "0.33.0", "0.33.1.dev12+g0123abcd")] == ["0.33"] * 3
    assert [release_rules(v) for v in ("0.34.0", "0.34.0rc1", "0.35.1")] == ["0.34"] * 3


def test_033_discards_parameters_and_attributes_and_writes_buffers_back() -> None:
    found = models()
    fresh = snapshot(found)
    answer = emulate_discard(found, "zero", "0.33")
    after = snapshot(found)
    assert answer["rules"] == "0.33"
    # every parameter and plain attribute is gone, derived or aliasing ...
    assert all(zero(after[n]) for n in ("norm.weight", "alias", "fused", "embed", "head.weight", "head_t"))
    # ... but buffers come back by name, and with them the parameter memory a buffer shares
    assert same(after["rope"], fresh["rope"]) and same(after["bias_view"], fresh["bias_view"])
    assert same(after["proj.bias"], fresh["proj.bias"])
    assert packed_discarded(found["draft"])
    assert answer["target"] == {
        "parameter": 4, "attribute": 2, "packed": 0, "buffer": 0,
        "parameter_kept": 1, "attribute_kept": 0, "packed_kept": 0, "buffer_kept": 2,
    }  # fmt: skip
    assert answer["draft"] == {  # the shared embedding counts for both models; head_t is the attribute
        "parameter": 3, "attribute": 1, "packed": 1, "buffer": 0,
        "parameter_kept": 0, "attribute_kept": 0, "packed_kept": 0, "buffer_kept": 0,
    }  # fmt: skip


def test_034_discards_only_the_storages_of_parameters() -> None:
    found = models()
    fresh = snapshot(found)
    answer = emulate_discard(found, "zero", "0.34")
    after = snapshot(found)
    assert answer["rules"] == "0.34"
    assert all(zero(after[n]) for n in ("proj.bias", "norm.weight", "embed", "head.weight"))
    # a buffer and an attribute in a discardable parameter's storage go with it ...
    assert zero(after["bias_view"]) and zero(after["alias"])
    # ... while those in memory of their own are backed up: the derived attributes survive, nothing is saved by name
    assert same(after["rope"], fresh["rope"]) and same(after["fused"], fresh["fused"])
    assert same(after["head_t"], fresh["head_t"])
    assert packed_discarded(found["draft"])
    assert answer["target"] == {
        "parameter": 5, "attribute": 1, "packed": 0, "buffer": 1,
        "parameter_kept": 0, "attribute_kept": 1, "packed_kept": 0, "buffer_kept": 1,
    }  # fmt: skip
    assert answer["draft"]["attribute"] == 0 and answer["draft"]["attribute_kept"] == 1


@pytest.mark.parametrize("rules", DISCARD_RULES)
def test_draft_prefixed_patterns_keep_the_drafters_own_parameters_and_packed_weights(rules: str) -> None:
    found = models()
    fresh = snapshot(found)
    answer = emulate_discard(found, "zero", rules, ("draft.*",))
    after = snapshot(found)
    assert answer["preserve"] == ["draft.*"]
    assert same(after["head.weight"], fresh["head.weight"]) and not packed_discarded(found["draft"])
    assert zero(after["embed"])  # the embedding the drafter shares is the target's: its reload brings it back
    assert answer["draft"]["parameter"] == 1 and answer["draft"]["parameter_kept"] == 2
    assert answer["draft"]["packed"] == 0 and answer["draft"]["packed_kept"] == 1
    # what was derived from a preserved parameter: 0.33 writes back only the parameters it saved by name
    assert same(after["head_t"], fresh["head_t"]) == (rules == "0.34")


@pytest.mark.parametrize("rules", DISCARD_RULES)
def test_target_patterns_keep_the_target_parameter_and_what_aliases_it(rules: str) -> None:
    found = models()
    fresh = snapshot(found)
    answer = emulate_discard(found, "zero", rules, ("norm.weight", "embed.*"))
    after = snapshot(found)
    assert same(after["norm.weight"], fresh["norm.weight"]) and same(after["alias"], fresh["alias"])
    assert same(after["embed"], fresh["embed"])  # shared with the drafter, kept for both
    assert answer["draft"]["parameter_kept"] == 1
    assert zero(after["fused"]) == (rules == "0.33")


@pytest.mark.parametrize("rules", DISCARD_RULES)
@pytest.mark.parametrize("pattern", ["head.weight", "draft.embed.weight", "draft.nothing*"])
def test_a_pattern_that_picks_nothing_fails_as_vllms_sleep_does(rules: str, pattern: str) -> None:
    """The drafter's parameters are `draft.<name>`, and its parameters shared with the target are the target's."""
    found = models()
    fresh = snapshot(found)
    with pytest.raises(ValueError, match=f"No parameter matches sleep retention: {pattern}"):
        emulate_discard(found, "zero", rules, (pattern,))
    assert all(same(t, fresh[n]) for n, t in snapshot(found).items())  # refused before anything was discarded


@pytest.mark.parametrize("rules", DISCARD_RULES)
def test_draft_star_picks_nothing_without_a_drafter_and_is_no_error(rules: str) -> None:
    found = models()
    answer = emulate_discard({"target": found["target"], "draft": None}, "zero", rules, ("draft.*",))
    assert answer["draft_present"] is False and answer["target"]["parameter"] > 0


def test_unknown_rules_are_refused() -> None:
    with pytest.raises(ValueError, match="rules"):
        emulate_discard(models(), "zero", "0.35")


class Worker(SpecwakeWorkerExtension):
    def __init__(self, preserve: list[str]) -> None:
        found = models()
        model_config = SimpleNamespace(sleep_preserve_parameter_names=preserve)
        self.vllm_config = SimpleNamespace(model_config=model_config, speculative_config=None)
        self.model_runner = SimpleNamespace(
            get_model=lambda: found["target"], drafter=SimpleNamespace(model=found["draft"])
        )
        self.rank = 0


@pytest.mark.parametrize(("version", "rules"), [("0.32.0", "0.33"), ("0.34.0", "0.34")])
def test_the_worker_follows_its_vllms_rules_and_the_servers_preserve_flag(
    monkeypatch: pytest.MonkeyPatch, version: str, rules: str
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__=version))
    answer = Worker(["draft.head.*"]).specwake_emulate_discard()
    assert answer["rules"] == rules and answer["preserve"] == ["draft.head.*"]
    assert answer["draft"]["parameter_kept"] == 2
    assert Worker([]).specwake_emulate_discard(rules="0.34")["rules"] == "0.34"  # a scenario's choice wins


def test_the_scenario_key_takes_the_rules_the_protocol_names(tmp_path: Any) -> None:
    from typing import get_args

    from specwake.errors import ScenarioError
    from specwake.prepare.scenario import load_scenario
    from specwake.prepare.scenario_file import DiscardRules
    from tests.helpers.scenario_texts import MINIMAL

    assert get_args(DiscardRules) == DISCARD_RULES
    file = tmp_path / "s.toml"
    file.write_text(
        MINIMAL + '[cycle]\ndiscard_rules = "0.34"\n[variants.baseline]\n[variants.old]\ndiscard_rules = "0.33"\n'
        "[variants.plain]\n"
    )
    rules = {v.name: v.discard_rules for v in load_scenario(file).variants}
    assert rules == {"baseline": "0.34", "old": "0.33", "plain": "0.34"}
    file.write_text(MINIMAL + "[variants.baseline]\n")
    assert [v.discard_rules for v in load_scenario(file).variants] == [None]  # the worker's vLLM decides
    file.write_text(MINIMAL + '[variants.baseline]\ndiscard_rules = "0.35"\n')
    with pytest.raises(ScenarioError, match=r"variants\.baseline\.discard_rules"):
        load_scenario(file)


def test_the_discard_step_carries_the_scenarios_rules_to_the_worker() -> None:
    from specwake.run.measure.cycle import cycle_steps

    def discard(rules: str | None) -> tuple[tuple[str, str], ...]:
        return next(s for s in cycle_steps(2, True, "nan", rules=rules) if s.name == "discard").rpc_kwargs

    assert discard("0.34") == (("fill", "nan"), ("rules", "0.34"))
    assert discard(None) == (("fill", "nan"),)  # the worker follows its own vLLM
