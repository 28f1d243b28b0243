"""A throwaway fake "interpreter with vLLM" for driving the real specwake CLI against fake servers in seconds.

`make_fake_engine(tmp)` writes `bin/python` (execs this Python with a tiny fake `vllm` package on PYTHONPATH)
whose `vllm.entrypoints.openai.api_server` runs tests/fake_server.py; helpers write scenarios and scan /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FAKE_SERVER = TESTS / "fake_server.py"
MARK_NAME = "SPECWAKE_FAKE_ENGINE_MARK"  # set in every process the fake interpreter starts

# The fake drafter's behaviour after a discard lives in the fake vLLM package, so a diff can "fix" it.
BEHAVIOUR = "vllm/drafter_reload.py"
BEHAVIOUR_TEXT = (
    "# Whether reload_weights also reloads the drafter (the bug of vLLM issue #52479).\nRELOADS_DRAFT = False\n"
)
FIX_DIFF = f"""\
--- a/{BEHAVIOUR}
+++ b/{BEHAVIOUR}
@@ -1,2 +1,2 @@
 # Whether reload_weights also reloads the drafter (the bug of vLLM issue #52479).
-RELOADS_DRAFT = False
+RELOADS_DRAFT = True
"""

_API_SERVER = '''\
"""Fake `vllm.entrypoints.openai.api_server`: accept vLLM's flags, serve tests/fake_server.py."""
import argparse, os, shlex, sys, time

from vllm import drafter_reload

import hashlib
token = os.environ.get("HF_TOKEN")
token_sha = hashlib.sha256(token.encode()).hexdigest() if token is not None else "-"
with open({launches!r}, "a") as fh:
    fh.write(f"{{os.getpid()}} {{time.time()}} hf_token_sha256={{token_sha}} {{shlex.join(sys.argv[1:])}}\\n")
parser = argparse.ArgumentParser()
parser.add_argument("--host", required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--model", required=True)
known, _ignored = parser.parse_known_args()  # --dtype, --speculative-config, --seed, ... mean nothing here
sys.path.insert(0, {tests!r})
import fake_server

argv = ["--host", known.host, "--port", str(known.port), "--model", known.model]
argv += ["--mode", os.environ.get("FAKE_VLLM_MODE", "ready")]
argv += ["--al-after", "4.0" if drafter_reload.RELOADS_DRAFT else "1.0"]
argv += shlex.split(os.environ.get("FAKE_VLLM_ARGS", ""))
fake_server.main(argv)
'''

_PLATFORMS = """\
class _CpuPlatform:
    device_type = "cpu"

    def is_sleep_mode_available(self):
        return False


current_platform = _CpuPlatform()
"""


@dataclass(frozen=True)
class FakeEngine:
    root: Path
    python: Path  # the executable to name in `python = "..."`
    package: Path  # the fake vllm package folder
    launches: Path  # one line per fake server started: "pid time argv"
    mark: str  # value of MARK_NAME in every process it started

    def invocations(self) -> list[str]:
        """Every start of the fake interpreter (probe, model build, server): its arguments."""
        path = self.root / "invocations.log"
        return path.read_text().splitlines() if path.exists() else []

    def launched(self) -> list[str]:
        return self.launches.read_text().splitlines() if self.launches.exists() else []

    def survivors(self) -> list[tuple[int, str]]:
        return processes_with_env(MARK_NAME, self.mark)

    def write_fix(self, folder: Path) -> Path:
        path = folder / "fix.diff"
        path.write_text(FIX_DIFF)
        return path


def make_fake_engine(tmp: Path) -> FakeEngine:
    """Build the fake interpreter under `tmp/fake-engine/`."""
    root = tmp / "fake-engine"
    site = root / "site"
    pkg = site / "vllm"
    launches = root / "launches.log"
    mark = uuid.uuid4().hex
    files = {
        "__init__.py": '__version__ = "0.0.fake"\n',
        "drafter_reload.py": BEHAVIOUR_TEXT,
        "platforms/__init__.py": _PLATFORMS,
        "entrypoints/__init__.py": "",
        "entrypoints/openai/__init__.py": "",
        "entrypoints/openai/api_server.py": _API_SERVER.format(launches=str(launches), tests=str(TESTS)),
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {root / "invocations.log"}\n'
        f"export {MARK_NAME}={mark} PYTHONDONTWRITEBYTECODE=1\n"
        f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}"\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return FakeEngine(root, python, pkg, launches, mark)


def scenario_text(
    engine: FakeEngine,
    *,
    variants: dict[str, dict[str, str]] | None = None,
    expect: dict[str, str] | None = None,
    patch: str | None = None,
    model: str = "fake-model",
    cycles: int = 1,
    repeats: int = 2,
    request_timeout_s: float = 20,
    step_timeout_s: float = 20,
    startup_timeout_s: float = 30,
    server_env: dict[str, str] | None = None,
    extra: str = "",
) -> str:
    """A small scenario TOML on the fake engine. `variants`: name → env (FAKE_VLLM_* settings)."""
    variants = variants if variants is not None else {"baseline": {}}
    lines = [
        "[server]",
        f"model = {json.dumps(model)}",
        f"startup_timeout_s = {startup_timeout_s}",
        f"env = {_inline(server_env or {})}",
        "[speculative]",
        'method = "draft_model"',
        f"model = {json.dumps(model)}",
        "num_speculative_tokens = 3",
        "[workload]",
        'prompts = ["one two three", "four five"]',
        f"max_tokens = 16\nrepeats = {repeats}\nwarmup = 1\nrequest_timeout_s = {request_timeout_s}",
        "[cycle]",
        f"count = {cycles}\nstep_timeout_s = {step_timeout_s}",
    ]
    for name, env in variants.items():
        lines += [f"[variants.{name}]", f"python = {json.dumps(str(engine.python))}", f"env = {_inline(env)}"]
        if patch is not None and name == "patched":
            lines.append(f"patch = {json.dumps(patch)}")
    if expect:
        lines += ["[expect]"] + [f"{k} = {json.dumps(v)}" for k, v in expect.items()]
    return "\n".join(lines) + "\n" + extra


def _inline(env: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }"


def cli_env(cache: Path, **extra: str) -> dict[str, str]:
    """Environment for a `python -m specwake.cli` subprocess: private cache, no colour."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_TOKEN")}
    env.update({"SPECWAKE_CACHE": str(cache), "NO_COLOR": "1", "COLUMNS": "200"}, **extra)
    return env


def run_cli(args: list[str], cache: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specwake.cli", *args],
        cwd=REPO,
        env=cli_env(cache, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def processes_with_env(name: str, value: str) -> list[tuple[int, str]]:
    """(pid, name) of live, non-zombie processes whose environment holds NAME=VALUE."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] != "Z":
            found.append((int(entry.name), stat[stat.find("(") + 1 : stat.rfind(")")]))
    return found


def kill_survivors(engine: FakeEngine) -> list[tuple[int, str]]:
    """SIGKILL whatever the fake engine left running (never leak onto the shared machine); return it."""
    found = engine.survivors()
    for pid, _ in found:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return found


def one_run_dir(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, f"expected one run folder in {out}, got {runs}"
    return runs[0]


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()
