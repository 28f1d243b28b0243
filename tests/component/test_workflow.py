"""The nightly GitHub workflow (examples/nightly-gpu.yml): valid against GitHub's workflow schema (the copy that
check-jsonschema ships, so offline), every action on a current major, and its merge job red when the night regressed:
the trend step is run here as GitHub runs it — with the shell the workflow declares — on results built from the test
builders, the newer one with a patched variant's AL dropped. The step that fetches the kept nights runs too, its jq
on recorded API-shaped JSON served by a stand-in `gh`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from specwake.report import run_files
from specwake.results import ScenarioResult
from specwake.runfolder import write_files
from tests.helpers.builders import dropped, scaled, tiny_cpu
from tests.helpers.paths import REPO
from tests.helpers.procs import check_schema
from tests.helpers.weekly import assert_one_per_family, assert_runs_the_choice, chosen_by

WORKFLOW = REPO / "examples" / "nightly-gpu.yml"
# How GitHub runs `run:` for `shell: bash` and for no shell at all (docs: "Defaults / shell").
SHELLS = {"bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail"], None: ["bash", "-e"]}
NODE24_MAJORS = {  # the first major of each action whose action.yml says `runs.using: node24`, or later
    "actions/checkout": 5,
    "actions/upload-artifact": 6,
    "actions/download-artifact": 7,
    "mikepenz/action-junit-report": 6,
}


def workflow() -> dict[str, Any]:
    return dict(yaml.safe_load(WORKFLOW.read_text()))


def step(name: str) -> dict[str, Any]:
    return next(s for job in workflow()["jobs"].values() for s in job["steps"] if s.get("name", "").startswith(name))


def test_the_workflow_is_valid_against_githubs_schema() -> None:
    proc = check_schema(WORKFLOW, "vendor.github-workflows")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_action_runs_on_node24() -> None:
    uses = [s["uses"] for job in workflow()["jobs"].values() for s in job["steps"] if "uses" in s]
    assert uses
    for ref in uses:
        name, _, version = ref.partition("@")
        assert name in NODE24_MAJORS, f"{ref}: not an action this test knows the node24 major of"
        assert int(version.removeprefix("v").split(".")[0]) >= NODE24_MAJORS[name], ref


def test_the_servers_get_a_hub_token_for_the_gated_model() -> None:
    assert workflow()["jobs"]["shard"]["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}"
    assert "meta-llama" in (REPO / "scenarios" / "eagle3-eager.toml").read_text()  # why it is needed


def test_the_merge_job_fails_when_a_shard_failed() -> None:
    last = workflow()["jobs"]["merge"]["steps"][-1]
    assert last["if"] == "always() && needs.shard.result != 'success'" and "exit 1" in last["run"]


def write_run(folder: Path, result: ScenarioResult) -> None:
    write_files(folder / f"20261201-021700-{result.name}", run_files(result))


def trend(tmp_path: Path, nights: list[ScenarioResult], new: ScenarioResult) -> subprocess.CompletedProcess[str]:
    """The trend step's script, run in a workspace holding the kept nights (history/<date>/, oldest first) and
    tonight's results, with the shell the workflow declares; `.venv/bin/specwake` is this checkout's specwake."""
    for day, night in enumerate(nights, start=1):  # each started on the night its folder is named after
        write_run(tmp_path / "history" / f"202611{day:02d}", replace(night, started_at=f"2026-11-{day:02d}T02:17:00Z"))
    write_run(tmp_path / "merged", replace(new, started_at="2026-12-01T02:17:00Z"))
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "specwake").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m specwake.cli "$@"\n')
    (venv / "specwake").chmod(0o755)
    summary = tmp_path / "summary.md"
    shell = SHELLS[workflow().get("defaults", {}).get("run", {}).get("shell")]
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [*shell, "-c", step("Trend against the earlier nights")["run"]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_trend_step_fails_the_night_on_a_regression(tmp_path: Path) -> None:
    proc = trend(tmp_path, [tiny_cpu()], dropped(tiny_cpu()))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # compare's exit code survives `| tee`
    assert "regression" in (tmp_path / "summary.md").read_text()


def test_the_trend_step_passes_a_night_like_the_last(tmp_path: Path) -> None:
    proc = trend(tmp_path, [tiny_cpu()], tiny_cpu())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_trend_step_calls_tok_s_against_every_kept_night(tmp_path: Path) -> None:
    nights = [scaled(tiny_cpu(), f) for f in (1.0, 0.98, 1.02, 1.01)]  # GPU nights: a real discard
    proc = trend(tmp_path, nights, scaled(tiny_cpu(), 0.5))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "4 earlier runs" in summary and "| tok/s, every stage |" in summary


def test_the_trend_step_draws_the_nights_into_the_summary_and_a_chart(tmp_path: Path) -> None:
    nights = [scaled(tiny_cpu(), f) for f in (1.0, 0.98, 1.02)]
    proc = trend(tmp_path, nights, scaled(tiny_cpu(), 1.01))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "### Trend over 4 nights" in summary and "| tiny-cpu | patched | `" in summary  # sparklines
    assert (tmp_path / "results" / "trend.png").read_bytes().startswith(b"\x89PNG")
    upload = step("Keep the trend chart")
    assert upload["with"]["path"] == "results/trend.png" and upload["if"] == "always()"


def test_the_kept_nights_roll_over_at_seven(tmp_path: Path) -> None:
    history = tmp_path / "history"
    for day in range(1, 9):
        (history / f"202611{day:02d}").mkdir(parents=True)
    (tmp_path / "merged").mkdir()
    shell = SHELLS[workflow().get("defaults", {}).get("run", {}).get("shell")]
    keep = step("Keep tonight with the last 7 nights")["run"]
    proc = subprocess.run([*shell, "-c", keep], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    kept = sorted(p.name for p in history.iterdir())
    assert len(kept) == 7 and "20261101" not in kept and "20261102" not in kept  # tonight in, the oldest two out


# A stand-in `gh` for the fetch step: `run list` (honouring --status, --limit, --json fields and --jq, the last through
# jq, whose language gh's --jq speaks), `api` for the artifacts of the repository (filtered by name, as the API does),
# `run download` (logged; it fails, as gh does, when that run kept no such artifact).
FAKE_GH = """\
import json, os, subprocess, sys
from urllib.parse import parse_qs, urlsplit

args = sys.argv[1:]
data = json.load(open(os.environ["FAKE_GH_DATA"]))


def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default


if args[:2] == ["run", "list"]:
    if (opt("--repo"), opt("--workflow")) != (data["repo"], data["workflow"]):
        sys.exit(f"fake gh: runs of {opt('--repo')} {opt('--workflow')}: none recorded")
    runs = [r for r in data["runs"] if opt("--status") in (None, r["status"])][: int(opt("--limit", "20"))]
    out = json.dumps([{f: r[f] for f in opt("--json").split(",")} for r in runs])
    if opt("--jq"):
        out = subprocess.run(["jq", "-r", opt("--jq")], input=out, capture_output=True, text=True, check=True).stdout
    print(out.rstrip("\\n"))
elif args[0] == "api":
    url = urlsplit(args[1])
    if url.path != f"repos/{data['repo']}/actions/artifacts":
        sys.exit(f"fake gh: no recording of {args[1]}")
    name = parse_qs(url.query).get("name", [None])[0]
    artifacts = [a for a in data["artifacts"] if name in (None, a["name"])]
    print(json.dumps({"total_count": len(artifacts), "artifacts": artifacts}))
elif args[:2] == ["run", "download"]:
    with open(os.environ["FAKE_GH_LOG"], "a") as log:
        log.write(f"{args[2]} {opt('--name')}\\n")
    kept = [a for a in data["artifacts"] if str(a["workflow_run"]["id"]) == args[2] and a["name"] == opt("--name")]
    if not [a for a in kept if not a["expired"]]:
        sys.exit("no valid artifacts found to download")
    os.makedirs(os.path.join(opt("--dir"), "20261130"))
else:
    sys.exit(f"fake gh: unexpected {args}")
"""
REPOSITORY, THIS_RUN = "acme/vllm-nightly", 9005


def gh_run(run_id: int, status: str, conclusion: str, created: str) -> dict[str, Any]:
    """One run as `gh run list --json` gives it."""
    return {"databaseId": run_id, "status": status, "conclusion": conclusion, "createdAt": created,
            "event": "schedule", "headBranch": "main", "workflowName": workflow()["name"]}  # fmt: skip


def artifact(artifact_id: int, name: str, run_id: int, created: str, expired: bool = False) -> dict[str, Any]:
    """One artifact as GET /repos/{owner}/{repo}/actions/artifacts gives it."""
    url = f"https://api.github.com/repos/{REPOSITORY}/actions/artifacts/{artifact_id}"
    return {
        "id": artifact_id, "node_id": f"MDg6QXJ0aWZhY3Q{artifact_id}", "name": name, "size_in_bytes": 48213,
        "url": url, "archive_download_url": f"{url}/zip", "expired": expired, "created_at": created,
        "updated_at": created, "expires_at": "2026-12-30T02:40:00Z", "digest": f"sha256:{artifact_id:064x}",
        "workflow_run": {"id": run_id, "repository_id": 7001, "head_repository_id": 7001, "head_branch": "main",
                         "head_sha": f"{run_id:040x}"},
    }  # fmt: skip


def fetch_history(
    tmp_path: Path, runs: list[dict[str, Any]], artifacts: list[dict[str, Any]]
) -> tuple[int, str, list[str]]:
    """The fetch step's script, run with the workflow's shell against the stand-in `gh` serving `runs` (newest first)
    and `artifacts`: (exit code, output, the runs it downloaded specwake history from)."""
    data = {"repo": REPOSITORY, "workflow": workflow()["name"], "runs": runs, "artifacts": artifacts}
    (tmp_path / "gh.json").write_text(json.dumps(data))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(f"#!{sys.executable}\n{FAKE_GH}")
    (bin_dir / "gh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_GH_DATA": str(tmp_path / "gh.json"),
           "FAKE_GH_LOG": str(tmp_path / "gh.log"), "GITHUB_REPOSITORY": REPOSITORY,
           "GITHUB_WORKFLOW": workflow()["name"], "GITHUB_RUN_ID": str(THIS_RUN)}  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    shell = SHELLS[workflow().get("defaults", {}).get("run", {}).get("shell")]
    script = step("Fetch the earlier nights' merged results")["run"]
    proc = subprocess.run([*shell, "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    log = tmp_path / "gh.log"
    downloads = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, downloads


def test_the_kept_nights_come_from_the_newest_run_that_uploaded_them(tmp_path: Path) -> None:
    runs = [
        gh_run(THIS_RUN, "in_progress", "", "2026-12-05T02:17:00Z"),
        gh_run(9004, "completed", "cancelled", "2026-12-04T02:17:00Z"),  # cancelled before its merge job: none saved
        gh_run(9003, "completed", "failure", "2026-12-03T02:17:00Z"),
        gh_run(9002, "completed", "success", "2026-12-02T02:17:00Z"),
    ]
    artifacts = [
        artifact(506, "specwake-shard-1", 9004, "2026-12-04T04:00:00Z"),
        artifact(505, "specwake-history", 9006, "2026-12-04T09:00:00Z"),  # the same name from another workflow
        artifact(504, "specwake-history", 9003, "2026-12-03T04:40:00Z"),
        artifact(503, "specwake-shard-1", 9003, "2026-12-03T04:00:00Z"),
        artifact(502, "specwake-history", 9002, "2026-12-02T04:40:00Z"),
        artifact(401, "specwake-history", 8001, "2026-10-30T04:40:00Z", expired=True),
    ]
    code, output, downloads = fetch_history(tmp_path, runs, artifacts)
    assert downloads == ["9003 specwake-history"], output  # not 9004, the last completed run
    assert code == 0, output
    assert (tmp_path / "work" / "history").is_dir()


def test_the_first_night_finds_no_kept_nights_and_goes_on(tmp_path: Path) -> None:
    runs = [gh_run(THIS_RUN, "in_progress", "", "2026-12-05T02:17:00Z")]
    code, output, downloads = fetch_history(
        tmp_path, runs, [artifact(505, "specwake-history", 9006, "2026-12-04T09:00:00Z")]
    )
    assert code == 0 and downloads == [], output
    assert "no nights to compare with" in output


def test_a_weekly_job_runs_the_release_checks_and_the_families_on_the_newest_vllm_and_nothing_else_runs_then() -> None:
    flow = workflow()
    weekly = [c["cron"] for c in flow[True]["schedule"] if c["cron"] != "17 2 * * *"]  # YAML reads `on:` as True
    assert len(weekly) == 1 and weekly[0].endswith("1")  # a weekday: once a week
    jobs = flow["jobs"]
    assert f"github.event.schedule == '{weekly[0]}'" in jobs["latest-vllm"]["if"]
    assert f"github.event.schedule != '{weekly[0]}'" in jobs["shard"]["if"] and weekly[0] in jobs["merge"]["if"]
    runs = "\n".join(s.get("run", "") for s in jobs["latest-vllm"]["steps"])
    assert "pip install --upgrade vllm" in runs and "[gpu]" not in runs  # the newest, not the extra's range
    assert_runs_the_choice(runs, ".venv/bin/specwake run")


@pytest.mark.parametrize("gpus", ["the job's", 2, 1])
def test_the_weekly_job_runs_one_scenario_per_family_that_its_gpus_hold(gpus: int | str) -> None:
    """The job's own selection line, on the runner's GPUS and on smaller machines: every drafter family with a GPU
    scenario that fits runs once, the tiny-gpu canary among them; DeepSeek-V3's eight engines only where there are 8."""
    job = workflow()["jobs"]["latest-vllm"]
    assert job["env"]["GPUS"] == 8 and "gpu-8x" in job["runs-on"]  # the runner's label says its GPUs
    count = job["env"]["GPUS"] if gpus == "the job's" else int(gpus)
    chosen = chosen_by("\n".join(s.get("run", "") for s in job["steps"]), count)
    assert_one_per_family(chosen, count)
    assert "scenarios/tiny-gpu.toml" in chosen
    assert ("scenarios/deepseek-v3-dp-ep.toml" in chosen) == (count == 8), chosen
