"""The weekly job's selection (specwake.prepare.one_per_family): one GPU scenario per drafter family that a machine of
N GPUs holds, read from planted scenario files; and the shipped scenarios as the example jobs' runners see them."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.prepare.one_per_family import main, one_per_family
from specwake.prepare.scenario import Scenario, load_scenario
from tests.helpers.paths import REPO
from tests.helpers.scenario_texts import MINIMAL


def plant(folder: Path, name: str, *, tp: int = 1, dp: int = 1, family: str | None = "cpu/pair.toml",
          discard: str = "native", expect: str = 'baseline = "collapse"', nodes: str = "") -> Path:  # fmt: skip
    """A scenario file `name`.toml in `folder` (its family's CPU scenario planted beside it)."""
    (folder / "cpu").mkdir(exist_ok=True)
    (folder / "cpu" / "pair.toml").write_text(MINIMAL)
    (folder / "cpu" / "other.toml").write_text(MINIMAL)
    server = f"[server]\ntensor_parallel_size = {tp}\ndata_parallel_size = {dp}\n{nodes}"
    text = (f'cpu_scenario = "{family}"\n' if family else "") + MINIMAL.replace("[server]\n", server)
    path = folder / f"{name}.toml"
    path.write_text(text + f'[cycle]\ndiscard = "{discard}"\n[expect]\n{expect}\n')
    return path


def names(scenarios: tuple[Scenario, ...]) -> list[str]:
    return [s.name for s in scenarios]


def test_each_family_runs_once_and_a_scenario_that_can_fail_is_preferred(tmp_path: Path) -> None:
    files = [
        plant(tmp_path, "a-graphed", tp=2, expect='baseline = "any"'),  # expects nothing: fails on nothing
        plant(tmp_path, "b-eager", tp=2),
        plant(tmp_path, "c-small", tp=1, family="cpu/other.toml"),
        plant(tmp_path, "d-large", tp=2, family="cpu/other.toml"),  # the same family on more GPUs
    ]
    pick = one_per_family([load_scenario(f) for f in files], gpu_count=2)
    assert names(pick.chosen) == ["b-eager", "c-small"]
    why = {s.name: reason for s, reason in pick.left_out}
    assert why["a-graphed"].endswith("runs as b-eager") and why["d-large"].endswith("runs as c-small"), why


def test_what_a_machine_cannot_hold_is_left_out_with_why(tmp_path: Path) -> None:
    files = [
        plant(tmp_path, "eight", tp=4, dp=2, family="cpu/other.toml"),
        plant(tmp_path, "two", tp=2),
        plant(tmp_path, "on-cpu", discard="auto", family=None),
        plant(
            tmp_path,
            "two-nodes",
            tp=1,
            dp=2,
            family=None,
            nodes='nodes = 2\nnode_command = ["ssh", "gpu-{node}", "{command}"]\n',
        ),  # fmt: skip
    ]
    scenarios = [load_scenario(f) for f in files]
    assert names(one_per_family(scenarios, gpu_count=8).chosen) == ["eight", "two"]
    pick = one_per_family(scenarios, gpu_count=4)
    assert names(pick.chosen) == ["two"]
    assert {s.name: why for s, why in pick.left_out} == {
        "eight": "needs 8 GPUs, more than the 4 of this machine",
        "on-cpu": "not a GPU scenario (cycle.discard = 'auto')",
        "two-nodes": "spans 2 machines (server.nodes)",
    }


def test_a_scenario_without_a_family_is_a_family_alone(tmp_path: Path) -> None:
    files = [plant(tmp_path, "lone", family=None), plant(tmp_path, "paired")]
    assert names(one_per_family([load_scenario(f) for f in files], gpu_count=1).chosen) == ["lone", "paired"]


def test_the_command_prints_the_chosen_files_as_given_and_why_the_others_are_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(tmp_path, "one"), plant(tmp_path, "two", tp=2, family="cpu/other.toml")
    monkeypatch.chdir(tmp_path)
    assert main(["--gpu-count", "1", "one.toml", "two.toml"]) == 0
    out, err = capsys.readouterr()
    assert out == "one.toml\n"
    assert err == "two.toml: left out: needs 2 GPUs, more than the 1 of this machine\n"


def test_a_bad_file_is_one_line_and_exit_2_with_nothing_chosen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = plant(tmp_path, "good"), tmp_path / "bad.toml"
    bad.write_text(MINIMAL + "[cycle]\ndiscard = 'sometimes'\n")
    assert main(["--gpu-count", "8", str(good), str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and str(bad) in err and "cycle.discard" in err
    assert main(["--gpu-count", "0", str(good)]) == 2
    assert "--gpu-count: 0" in capsys.readouterr().err


@pytest.mark.parametrize(("gpus", "chosen"), [
    (1, ["tiny-gpu"]),
    (2, ["dspark", "eagle3-eager", "gemma4-mtp", "qwen-mtp", "tiny-gpu"]),
    (8, ["deepseek-v3-dp-ep", "dspark", "eagle3-eager", "gemma4-mtp", "qwen-mtp", "tiny-gpu"]),
])  # fmt: skip
def test_the_shipped_scenarios_give_every_family_a_machine_holds(gpus: int, chosen: list[str]) -> None:
    """EAGLE3 runs eager (its graphed twin expects only `any`); DeepSeek-V3's eight engines only on eight GPUs."""
    shipped = [load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.toml"))]
    assert names(one_per_family(shipped, gpus).chosen) == chosen
