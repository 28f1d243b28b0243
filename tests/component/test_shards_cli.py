"""CI fleets: the shard split never runs a job twice nor skips one, over many scenario sets; shards merge back into
one result per scenario; and `specwake run --shard` / `specwake report` do it through the CLI (fake engine)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from specwake.cli import app
from tests.helpers.fakeengine import kill_survivors, make_fake_engine, one_run_dir, run_cli, scenario_text
from tests.helpers.paths import DATA, REPO

SAMPLE = DATA / "result-v1-sample.json"
TRIALS = 2000


def test_run_two_shards_then_one_merged_report(tmp_path: Path) -> None:
    engine = make_fake_engine(tmp_path)
    diff = engine.write_fix(tmp_path)
    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.toml"
        path.write_text(scenario_text(engine, name=name, variants={"baseline": {}, "patched": {}}, patch=str(diff)))
        paths.append(path)
    outs = []
    for k in (1, 2):
        out = tmp_path / f"shard{k}"
        proc = run_cli(["run", *map(str, paths), "--output", str(out), "--shard", f"{k}/2"], tmp_path / "cache", 120)
        assert proc.returncode == 0, proc.stderr
        outs.append(one_run_dir(out))
    assert kill_survivors(engine) == []
    assert len(engine.launched()) == 4  # four jobs, each run once over both shards
    assert all(folder.name.endswith(f"-shard-{k}of2") for k, folder in zip((1, 2), outs, strict=True))
    result = CliRunner().invoke(app, ["report", *map(str, outs), "--format", "json"])
    assert result.exit_code == 0, result.output
    merged = json.loads(result.stdout)
    assert sorted(r["scenario"]["name"] for r in merged) == ["a", "b"]
    assert all(sorted(v["name"] for v in r["variants"]) == ["baseline", "patched"] for r in merged)
    assert all(len(r["scenario"]["shards"]) == 2 for r in merged)


def test_shard_and_no_shard_together_are_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["run", str(REPO / "scenarios" / "tiny-cpu.toml"), "--shard", "1/2", "--no-shard", "--output", str(out)]
    proc = run_cli(args, tmp_path / "cache", 60)
    assert proc.returncode == 2 and "--shard, --no-shard: choose one" in proc.stderr, proc.stderr
    assert not out.exists()
