"""The example jobs' weekly run on the newest vLLM (examples/nightly-gpu.yml, nightly-gpu.buildkite.yml), held to the
scenarios: the job's own line that chooses them, run in bash as the runner runs it, and what it must choose, read from
the scenario files' TOML here, not through specwake's selection (specwake.prepare.one_per_family)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict

from tests.helpers.paths import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SELECTION = "specwake.prepare.one_per_family"


def chosen_by(commands: str, gpus: int) -> list[str]:
    """The files the job's selection line (its `scenarios=$(...)`, `.venv/bin/python` this interpreter) chooses, run
    in bash from the repository root with GPUS set, as the job sets it."""
    (line,) = [line for line in commands.splitlines() if SELECTION in line]
    script = line.strip().replace(".venv/bin/python", sys.executable) + '\nprintf "%s\\n" $scenarios'
    env = {**os.environ, "GPUS": str(gpus)}
    proc = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


def families_held(gpus: int) -> dict[str, set[str]]:
    """Each drafter family (the cpu_scenario a shipped GPU scenario names) with a scenario that one machine of `gpus`
    GPUs holds: those scenarios' files, as `scenarios/NAME.toml`."""
    families: dict[str, set[str]] = defaultdict(set)
    for path in sorted((REPO / "scenarios").glob("*.toml")):
        doc = tomllib.loads(path.read_text())
        server = doc["server"]
        needs = server.get("tensor_parallel_size", 1) * server.get("data_parallel_size", 1)
        if doc.get("cycle", {}).get("discard") == "native" and needs <= gpus:
            families[doc.get("cpu_scenario", path.name)].add(f"scenarios/{path.name}")
    return dict(families)


def assert_one_per_family(chosen: list[str], gpus: int) -> None:
    """Every family a machine of `gpus` GPUs holds runs, once, as one of its scenarios that fits."""
    held = families_held(gpus)
    ran = {family: sorted(set(chosen) & files) for family, files in held.items()}
    assert all(len(files) == 1 for files in ran.values()), ran
    assert sorted(chosen) == sorted(f for files in ran.values() for f in files), (chosen, held)


def assert_runs_the_choice(commands: str, run: str) -> None:
    """The job's run (`run`, its specwake run line's start) takes the chosen files, after `make releases`."""
    assert f"{run} $scenarios" in commands, commands
    assert commands.index("make releases") < commands.index(SELECTION) < commands.index(run)


def unescaped(command: str) -> str:
    """A Buildkite command as the agent's shell gets it (`$$` is Buildkite's escape for `$`)."""
    return command.replace("$$", "$")
