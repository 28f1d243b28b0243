"""VLLM_RELOAD_MODE, which vLLM reads since 0.34: `direct` would reload the target in place while the drafter's
reload (the shipped fix's, specwake's push) stays layerwise, so specwake refuses it before anything starts, naming
where the server would get it from: the variant's env, the server's env, or specwake's own environment. The value
judged is the one build_server_env hands the server. (The vLLM side is pinned against the release sources in
tests/e2e/test_releases.py; the CLI's exit 2 in tests/component/test_releases_cli.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.errors import ScenarioError
from specwake.prepare.engine import EngineInfo
from specwake.prepare.plan import build_server_env
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import RELOAD_MODE, for_engine, reload_mode_problem
from tests.helpers.scenario_texts import MINIMAL


def engine(version: str) -> EngineInfo:
    return EngineInfo("/py", "3.12", version, Path("/pkg/vllm"), (f"vllm=={version}",), "cuda", True, None, 1, 16)


def scenario(tmp_path: Path, server: str | None = None, variant: str | None = None, levels: str = "2") -> Scenario:
    text = MINIMAL
    if server is not None:
        text = text.replace("[server]\n", f'[server]\nenv = {{ {RELOAD_MODE} = "{server}" }}\n')
    text += "[variants.baseline]\n[variants.patched]\n" + (
        f'env = {{ {RELOAD_MODE} = "{variant}" }}\n' if variant is not None else ""
    )
    text += f"[cycle]\nlevel = {levels}\n"
    path = tmp_path / "s.toml"
    path.write_text(text)
    return load_scenario(path)


def served(s: Scenario, environ: dict[str, str]) -> str | None:
    """The mode the patched variant's server would get."""
    env, _ = build_server_env(s, s.variants[-1], base_env=environ, pythonpath=[], is_gpu=True, cpu_ids=[0])
    return env.get(RELOAD_MODE)


@pytest.mark.parametrize(
    ("server", "variant", "environ", "key"),
    [
        ("direct", None, {}, f"server.env.{RELOAD_MODE}"),
        (None, "direct", {}, f"variants.patched.env.{RELOAD_MODE}"),
        ("layerwise", "direct", {}, f"variants.patched.env.{RELOAD_MODE}"),
        (None, None, {RELOAD_MODE: "direct"}, f"{RELOAD_MODE} in specwake's environment, which every server inherits"),
    ],
)
def test_direct_on_a_release_that_reads_it_is_exit_2_naming_where_the_server_gets_it(
    tmp_path: Path, server: str | None, variant: str | None, environ: dict[str, str], key: str
) -> None:
    s = scenario(tmp_path, server, variant)
    assert served(s, environ) == "direct"
    with pytest.raises(ScenarioError) as info:
        for_engine(s, s.variants[-1], engine("0.34.0"), environ)
    message = str(info.value)
    assert message.startswith(f'{s.file}: {key}: "direct": vLLM 0.34.0 would reload the target in place while the')
    assert (
        "drafter's reload (the reference fix's, specwake's push) stays layerwise: an untested mixed reload" in message
    )
    assert "\n" not in message
    # a dev build of 0.34 reads it too; 0.33 has no such variable, and the server runs as it always did
    assert reload_mode_problem(s, s.variants[-1], "0.34.1.dev3+gabc", environ) is not None
    assert reload_mode_problem(s, s.variants[-1], "0.33.0", environ) is None
    assert for_engine(s, s.variants[-1], engine("0.33.0"), environ).release == "0.33.0"


@pytest.mark.parametrize(
    ("server", "variant", "environ"),
    [
        (None, None, {}),
        ("layerwise", None, {RELOAD_MODE: "direct"}),  # the scenario's value is the one the server gets
        (None, "layerwise", {RELOAD_MODE: "direct"}),
        ("direct", "layerwise", {}),
    ],
)
def test_layerwise_or_unset_where_the_server_gets_it_passes(
    tmp_path: Path, server: str | None, variant: str | None, environ: dict[str, str]
) -> None:
    s = scenario(tmp_path, server, variant)
    assert served(s, environ) in (None, "layerwise")
    assert reload_mode_problem(s, s.variants[-1], "0.34.0", environ) is None


def test_a_value_vllm_refuses_is_refused_before_its_server_would_fail_to_start(tmp_path: Path) -> None:
    s = scenario(tmp_path, server="Direct")  # vLLM's choices are case-sensitive
    assert reload_mode_problem(s, s.variants[-1], "0.34.0", {}) == (
        f"server.env.{RELOAD_MODE}",
        '\'Direct\': vLLM 0.34.0 accepts only "layerwise" or "direct" (vllm/envs.py): its server would not start',
    )


def test_a_variant_of_several_levels_is_named_by_its_own_table(tmp_path: Path) -> None:
    s = scenario(tmp_path, variant="direct", levels="[1, 2]")
    names = [v.name for v in s.variants]
    assert names == ["baseline-L1", "baseline-L2", "patched-L1", "patched-L2"]
    for variant in s.variants[2:]:
        found = reload_mode_problem(s, variant, "0.34.0", {})
        assert found is not None and found[0] == f"variants.patched.env.{RELOAD_MODE}"
    assert reload_mode_problem(s, s.variants[0], "0.34.0", {}) is None
