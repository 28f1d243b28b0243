"""The order a packed CPU run starts its servers in (runner.launch_order, schedule.plan_schedule): the first server of
each warm launcher first, so that launchers make their imports side by side on different cores."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from specwake.prepare.overlay import Overlay
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant
from specwake.run.server.warm import LAUNCHERS
from specwake.run.session.runner import PAYS_IMPORTS_S, Work, launch_order, launcher_of
from specwake.run.session.schedule import plan_schedule
from specwake.runfolder import RunLayout
from tests.helpers.scenario_texts import MINIMAL
from tests.unit.test_data_parallel import ENGINE

# In key order the two stock V2 servers come first: side by side, one core would wait for the other's imports.
VARIANTS = """
[variants.a-stock]
[variants.b-stock]
[variants.c-v1]
model_runner = "v1"
[variants.d-patched]
[variants.e-stock]
"""


def _work(tmp_path: Path, engine: object = ENGINE, variants: str = VARIANTS) -> Work:
    path = tmp_path / "order.toml"
    path.write_text(MINIMAL + variants)
    scenario: Scenario = load_scenario(path)
    overlay = Overlay(tmp_path / "overlay", ("vllm/x.py",), (), "abc", False)
    prepared = [
        PreparedVariant(v, engine, overlay if v.name == "d-patched" else None, None, "/m", "/m", "emulated")  # type: ignore[arg-type]
        for v in scenario.variants
    ]
    return Work(scenario, prepared, RunLayout(tmp_path, (scenario.name,)))


def test_the_first_server_of_each_launcher_starts_before_a_second_of_any(tmp_path: Path) -> None:
    work = _work(tmp_path)
    kinds = {p.variant.name: launcher_of(work.scenario, p) for p in work.prepared}
    assert None not in kinds.values() and len(set(kinds.values())) == 3  # stock V2, V1, the patched tree
    jobs = launch_order([work])
    first = {job.key.split("/")[1] for job in jobs if job.est_seconds == PAYS_IMPORTS_S}
    assert first == {"a-stock", "c-v1", "d-patched"}
    plan = plan_schedule(jobs, [0, 1])
    started = [a.job.key.split("/")[1] for a in sorted(plan, key=lambda a: (a.start, a.gpus))]
    assert started[:3] == ["a-stock", "c-v1", "d-patched"]
    assert {kinds[name] for name in started[:2]} != {kinds["a-stock"]}  # two launchers import side by side
    # Without the ranking, key order would start a-stock and b-stock together: one launcher, one core waiting.
    unranked = plan_schedule([replace(job, est_seconds=1.0) for job in jobs], [0, 1])
    assert [a.job.key.split("/")[1] for a in unranked[:2]] == ["a-stock", "b-stock"]


def test_servers_that_start_cold_keep_the_key_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWAKE_WARM_START", "0")  # warm starts off: every server makes its own imports
    assert {job.est_seconds for job in launch_order([_work(tmp_path)])} == {1.0}
    monkeypatch.delenv("SPECWAKE_WARM_START")
    gpu = replace(ENGINE, platform="cuda", device_count=2)  # a GPU server starts cold
    assert {job.est_seconds for job in launch_order([_work(tmp_path, gpu)])} == {1.0}


def test_no_more_kinds_are_ranked_first_than_launchers_live_at_once(tmp_path: Path) -> None:
    # Each variant its own launcher (an environment of its own), two servers of each: ranking all of them first would
    # import every launcher before any second server came, retiring the first ones (warm.LAUNCHERS live at once).
    count = LAUNCHERS + 3
    text = "".join(f'[variants.k{i:02}-{n}]\nenv = {{ ORDER_KIND = "{i}" }}\n' for i in range(count) for n in (1, 2))
    work = _work(tmp_path, variants=text)
    assert len({launcher_of(work.scenario, p) for p in work.prepared}) == count
    first = [job.key.split("/")[1] for job in launch_order([work]) if job.est_seconds == PAYS_IMPORTS_S]
    assert first == [f"k{i:02}-1" for i in range(LAUNCHERS)]  # the first kinds in key order, one server each
