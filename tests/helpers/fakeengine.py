"""A throwaway fake "interpreter with vLLM" for driving the real specwake CLI against fake servers in seconds.

`make_fake_engine(tmp)` writes `bin/python` (execs this Python with a tiny fake `vllm` package on PYTHONPATH)
whose `vllm.entrypoints.openai.api_server` runs tests/helpers/fake_api_server.py: it records each server's life (start,
exit, CUDA_VISIBLE_DEVICES) and serves tests/helpers/fake_server.py; FAKE_VLLM_PLATFORM=cuda makes it a GPU machine.
Helpers write scenarios, find survivors.
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
from typing import Any

from specwake.run.server.warm import SWITCH as WARM_SWITCH
from specwake.runfolder import load_result
from tests.helpers.paths import HELPERS, REPO
from tests.helpers.procs import launch_env, processes_with_env

TESTS = HELPERS  # fake_api_server.py and fake_server.py, imported by the fake engine from here
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

# The fake vLLM's server entry point: tests/helpers/fake_api_server.py, found through the tests folder on sys.path.
# Run as vLLM's is (runpy, as `__main__`), never on import: a warm launcher imports it ahead of its servers.
_API_SERVER = """\
import os, sys

sys.path.insert(0, os.environ["FAKE_ENGINE_TESTS"])
import fake_api_server

if __name__ == "__main__":
    fake_api_server.main()
"""

# FAKE_VLLM_PLATFORM=cuda in the environment of specwake (its probe runs with it) makes the fake engine a
# CUDA machine with FAKE_VLLM_GPUS devices (default 4) and real sleep mode; anything else: CPU, no sleep mode.
_PLATFORMS = """\
import os


class _CpuPlatform:
    device_type = "cpu"

    def is_sleep_mode_available(self):
        return False


class _CudaPlatform:
    device_type = "cuda"

    def is_sleep_mode_available(self):
        return True

    def device_count(self):
        return int(os.environ.get("FAKE_VLLM_GPUS", "4"))


current_platform = _CudaPlatform() if os.environ.get("FAKE_VLLM_PLATFORM") == "cuda" else _CpuPlatform()
"""

# What specwake's launcher (specwake/worker/serve.py) wraps to keep the start method asked: the CPU platform's config
# check, which writes spawn over it as vLLM's does (vllm/platforms/cpu.py).
_CPU_PLATFORM = """\
import os


class CpuPlatform:
    @classmethod
    def check_and_update_config(cls, vllm_config):
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
"""


# The fake interpreter's torch: specwake's probe reads its version, and its GPU memory probe each GPU's free and total
# bytes (FAKE_VLLM_GPU_MEMORY="FREE/TOTAL" in GiB, one for every GPU or one per GPU separated by commas; default
# 80/80); nothing in a fake server uses it. The real torch would take seconds to import in every probe; specwake's
# worker modules (`-m specwake.worker.build` writes a builtin model's real weights, `-m specwake.worker.validate` may
# load its tokenizer) still get the real one.
_TORCH = """\
import os

__version__ = "0.0.fake"


class cuda:
    @staticmethod
    def mem_get_info(index):
        sizes = os.environ.get("FAKE_VLLM_GPU_MEMORY", "80/80").split(",")
        free, total = (float(part) * 2**30 for part in sizes[index % len(sizes)].split("/"))
        return int(free), int(total)
"""


@dataclass(frozen=True)
class ServerSpan:
    """One fake server's life as it recorded it: wall-clock start and exit, GPUs it was given, its log."""

    pid: int
    start: float
    end: float | None  # None: never recorded an exit (SIGKILL, os._exit): treated as still running
    gpus: tuple[int, ...] | None  # from CUDA_VISIBLE_DEVICES; None when unset
    log: Path | None
    how: str | None  # "SIGTERM" or "exit"
    cpus: tuple[int, ...] = ()  # the CPU cores the server was allowed to run on

    @property
    def key(self) -> str:
        """`<scenario folder>/<variant>` from the log path specwake gave it (`<folder>/logs/<variant>.log`)."""
        return f"{self.log.parent.parent.name}/{self.log.stem}" if self.log else f"pid {self.pid}"

    def overlaps(self, other: ServerSpan) -> bool:
        inf = float("inf")
        return self.start < (other.end or inf) and other.start < (self.end or inf)


def parse_spans(lines: list[str]) -> list[ServerSpan]:
    """The JSON lines of `FakeEngine.server_log` → one span per server, in start order."""
    starts: dict[int, dict[str, Any]] = {}
    exits: dict[int, dict[str, Any]] = {}
    for line in lines:
        record = json.loads(line)
        (starts if record["event"] == "start" else exits)[record["pid"]] = record
    spans = []
    for pid, rec in starts.items():
        end = exits.get(pid, {})
        devices = rec.get("cuda_visible_devices")
        gpus = tuple(int(g) for g in devices.split(",") if g) if devices is not None else None
        log = Path(rec["log"]) if rec.get("log") else None
        spans.append(ServerSpan(pid, rec["t"], end.get("t"), gpus, log, end.get("how"), tuple(rec.get("cpus", ()))))
    return sorted(spans, key=lambda span: span.start)


@dataclass(frozen=True)
class FakeEngine:
    root: Path
    python: Path  # the executable to name in `python = "..."`
    package: Path  # the fake vllm package folder
    launches: Path  # one line per fake server started: "pid time hf_token_sha256=... argv"
    mark: str  # value of MARK_NAME in every process it started

    def invocations(self) -> list[str]:
        """Every start of the fake interpreter (probe, model build, server): its arguments."""
        path = self.root / "invocations.log"
        return path.read_text().splitlines() if path.exists() else []

    def launched(self) -> list[str]:
        return self.launches.read_text().splitlines() if self.launches.exists() else []

    @property
    def server_log(self) -> Path:
        """JSON lines written by every fake server: {"event": "start"|"exit", "pid", "t", ...}."""
        return self.root / "servers.jsonl"

    def servers(self) -> list[ServerSpan]:
        return parse_spans(self.server_log.read_text().splitlines() if self.server_log.exists() else [])

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
    (root / "fake-torch" / "torch").mkdir(parents=True)
    (root / "fake-torch" / "torch" / "__init__.py").write_text(_TORCH)
    files = {
        "__init__.py": '__version__ = "0.0.fake"\n',
        "drafter_reload.py": BEHAVIOUR_TEXT,
        "platforms/__init__.py": _PLATFORMS,
        "platforms/cpu.py": _CPU_PLATFORM,
        "entrypoints/__init__.py": "",
        "entrypoints/openai/__init__.py": "",
        "entrypoints/openai/api_server.py": _API_SERVER,
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {root / "invocations.log"}\n'
        f"export {MARK_NAME}={mark} PYTHONDONTWRITEBYTECODE=1 FAKE_ENGINE_ROOT={root} FAKE_ENGINE_TESTS={TESTS}\n"
        f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}"\n'
        f'case "$1 $2" in "-m specwake.worker."*) ;; *) PYTHONPATH="$PYTHONPATH:{root / "fake-torch"}" ;; esac\n'
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
    name: str | None = None,
    tensor_parallel_size: int = 1,
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
    lines = [f"name = {json.dumps(name)}"] if name is not None else []
    lines += [
        "[server]",
        f"model = {json.dumps(model)}",
        f"tensor_parallel_size = {tensor_parallel_size}",
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
    """Environment for a `python -m specwake.cli` subprocess: private cache, no colour, every server started cold
    (each a start of the fake interpreter, which records it: tests/component/test_warm_start.py forks them warm)."""
    env = {k: v for k, v in launch_env().items() if k not in ("PYTHONPATH", "HF_TOKEN", "GITHUB_STEP_SUMMARY")}
    env.update({"SPECWAKE_CACHE": str(cache), "NO_COLOR": "1", "COLUMNS": "200", WARM_SWITCH: "0"}, **extra)
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


def run_text(
    engine: FakeEngine, tmp: Path, text: str, *flags: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`specwake run` on the scenario `text` (written to tmp/s.toml), results in tmp/out; no server may survive it."""
    scenario = tmp / "s.toml"
    scenario.write_text(text)
    out = tmp / "out"
    proc = run_cli(["run", str(scenario), "--output", str(out), *flags], tmp / "cache", **env)
    assert engine.survivors() == [], "specwake exited with a server still running"
    return proc, out


def result_of(out: Path) -> dict[str, Any]:
    """The one run folder's result.json, checked to load with specwake's own loader."""
    path = one_run_dir(out) / "result.json"
    load_result(path)
    return dict(json.loads(path.read_text()))


def variant(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in result["variants"] if v["name"] == name)


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
