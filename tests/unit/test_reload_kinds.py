"""The reload kinds as rows (weight_updates.RELOAD_KINDS): the scenario format's values, its key checks, the server's
flags, the cycle's steps, `check` and the report's words all follow each row, and every map keyed by kind holds every
row."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from specwake.errors import ScenarioError
from specwake.judge.verdict import judges_drafter
from specwake.prepare.engine import EngineInfo
from specwake.prepare.plan import build_server_command
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant
from specwake.protocol import ROLES, STEP_BY_NAME
from specwake.report.explain import sent_line
from specwake.report.summary import render_markdown
from specwake.results import Push
from specwake.run.measure.cycle import RESTORE_STEPS, cycle_steps
from specwake.run.session.assemble import push_of
from specwake.run.session.check import measurement_plan
from specwake.weight_updates import KIND_BY_VIA, PUSH_KEYS, RELOAD_KINDS, PushRequest, ReloadKind
from tests.helpers.builders import tiny_cpu
from tests.helpers.scenario_texts import MINIMAL

KINDS = list(RELOAD_KINDS.values())
ENGINE = EngineInfo("/py", "3.11", "0.32.0", Path("/pkg/vllm"), ("vllm==0.32.0",), "cpu", False, None, 0, 2)


def load(tmp_path: Path, kind: ReloadKind, extra: str = "") -> Scenario:
    path = tmp_path / f"{kind.name}.toml"
    path.write_text(MINIMAL + f"[cycle]\nreload = '{kind.name}'\n[variants.baseline]\n{extra}")
    return load_scenario(path)


def prepared(s: Scenario) -> PreparedVariant:
    return PreparedVariant(s.variants[0], ENGINE, None, None, "/m/target", "/m/draft", "emulated")


def test_every_map_keyed_by_kind_holds_every_row() -> None:
    assert set(RESTORE_STEPS) == set(RELOAD_KINDS)
    assert set(KIND_BY_VIA.values()) == set(KINDS) and len(KIND_BY_VIA) == len(KINDS)  # one via per kind
    assert all(key in PUSH_KEYS for kind in KINDS for key in kind.keys)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_kind_is_a_scenario_value_with_its_keys_and_no_others(tmp_path: Path, kind: ReloadKind) -> None:
    s = load(tmp_path, kind)
    assert s.cycle.reload_kind is kind
    for key in PUSH_KEYS:
        values = {"push_scale": "{'lm_head.weight' = 2.0}", "push_fault": "'target-also-to-draft'"}
        value = values.get(key, "['target']")
        text = f"{key} = {value}\n"
        if key in kind.keys:
            load(tmp_path, kind, text)
        else:
            with pytest.raises(ScenarioError, match=f"variants.baseline.{key}: only with cycle.reload"):
                load(tmp_path, kind, text)


def test_a_name_outside_the_table_is_refused_naming_every_row(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(MINIMAL + "[cycle]\nreload = 'pull'\n")
    with pytest.raises(ScenarioError) as refused:
        load_scenario(path)
    assert all(f"'{kind.name}'" in str(refused.value) for kind in KINDS)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_kind_sets_its_server_flags_and_refuses_them_in_the_scenario(tmp_path: Path, kind: ReloadKind) -> None:
    s = load(tmp_path, kind)
    argv = build_server_command(
        s, s.variants[0], python="/py", port=1, model="/m", draft_model="/d", sleep_mode=False, is_gpu=False
    )
    for flag, value in kind.server_flags:
        assert argv[argv.index(flag) + 1] == value
        path = tmp_path / "flag.toml"
        args = f"[server]\nargs = ['{flag}', '{{}}']\n"
        path.write_text(MINIMAL.replace("[server]\n", args) + f"[cycle]\nreload = '{kind.name}'\n")
        with pytest.raises(ScenarioError, match=f"{flag} is set by specwake"):
            load_scenario(path)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_kind_brings_the_weights_back_by_its_steps_and_check_says_so(tmp_path: Path, kind: ReloadKind) -> None:
    s = load(tmp_path, kind)
    push = push_of(s, prepared(s))
    assert (push.via if push is not None else None) == kind.via
    names = [step.name for step in cycle_steps(2, True, push=push)]
    restoring = [step.name for step in RESTORE_STEPS[kind.name](push, 1, None)]
    assert names[names.index("wake_weights") + 1 : names.index("wake_kv_cache")] == restoring
    assert STEP_BY_NAME[restoring[-1]].wakes  # counted in the wake's time
    plan = "\n".join(measurement_plan(s, [prepared(s)]))
    assert " → ".join(restoring) in plan
    assert (f"; {kind.check_verb} target" in plan) == (kind.check_verb is not None)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_the_drafter_is_judged_and_the_report_words_follow_the_row(kind: ReloadKind) -> None:
    push = Push(("target",), {"lm_head.weight": 2.0}, kind.via) if kind.via is not None else None
    assert judges_drafter(push) == (not kind.pushes)  # a push or sync that skips the drafter leaves it unjudged
    if push is not None:
        assert (sent_line(push) or "").startswith(f"the {kind.noun} scaled lm_head.weight ×2")
    result = tiny_cpu()  # both variants with the emulated discard
    settings = result.scenario["settings"] | {"cycle": {"reload": kind.name}}
    variants = [replace(v, push=push) for v in result.variants]
    text = render_markdown([replace(result, variants=variants, scenario=result.scenario | {"settings": settings})])
    assert kind.restored_by.format(pushed="baseline: target; patched: target") in text
    if kind.did:
        assert kind.did.format(to="target") in text


def test_a_push_request_of_each_kind_travels_by_its_via() -> None:
    for kind in (k for k in KINDS if k.via is not None):
        request = PushRequest(ROLES, via=kind.via)
        assert Push.of(request).syncs == kind.syncs == request.syncs


def test_the_scenario_format_lists_every_kind() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "scenario-format.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `cycle.reload`"))
    assert all(f'`"{kind.name}"`' in row for kind in KINDS)
