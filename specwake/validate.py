"""Before anything starts: a scenario's `[speculative]` table and server arguments checked by the variant's own vLLM
(specwake.worker.validate, run in its interpreter), so a typo is exit 2 naming the file and key, not a server that
fails after minutes on a GPU. Answers are cached per installation and request; a vLLM that cannot answer (too old,
or not a real vLLM) only costs the check, never the run.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from specwake.engine import EngineInfo, install_stamp
from specwake.errors import ScenarioError
from specwake.events import Event, Events
from specwake.files import write_cache
from specwake.models import builder_env
from specwake.scenario import Scenario, Variant

TIMEOUT_S = 300.0
PREFIX = "SPECWAKE_VALIDATE "


def request_for(scenario: Scenario, variant: Variant, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "speculative": dict(scenario.speculative) if variant.speculative else {},
        "args": list(scenario.server.args),
        "variant_args": list(variant.args),
    }


def ask_engine(engine: EngineInfo, request: dict[str, Any], cache: Path | None) -> dict[str, Any] | str:
    """vLLM's answer to `request` (a dict), or why it could not answer (a str)."""
    stamp = install_stamp(engine.python) if cache is not None else None
    key = hashlib.sha256(json.dumps([stamp, request], sort_keys=True).encode()).hexdigest()[:24]
    cached = cache / "validations" / f"{key}.json" if cache is not None and stamp is not None else None
    if cached is not None and cached.is_file():
        try:
            answer: dict[str, Any] = json.loads(cached.read_text())
            return answer
        except (OSError, ValueError):
            pass
    env = builder_env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        proc = subprocess.run(
            [engine.python, "-m", "specwake.worker.validate"],
            input=json.dumps(request), capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(PREFIX)), None)
    if proc.returncode != 0 or line is None:
        return (proc.stderr.strip().splitlines() or ["no answer"])[-1]
    answer = json.loads(line.removeprefix(PREFIX))
    if cached is not None:
        write_cache(cached, json.dumps(answer))
    return answer


def check_answer(scenario: Scenario, variant: Variant, answer: dict[str, Any]) -> None:
    """Raise ScenarioError (exit 2) for the first problem vLLM found, naming the file and the key."""
    file, version = str(scenario.file), answer.get("vllm", "?")
    for key in answer.get("unknown_keys") or []:
        valid = list(answer.get("valid_keys") or [])
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        reason = f"not a field of vLLM {version}'s SpeculativeConfig ({hint}valid: {', '.join(valid)})"
        raise ScenarioError(file, f"speculative.{key}", reason)
    for key, reason in (answer.get("bad_values") or {}).items():
        raise ScenarioError(file, f"speculative.{key}", f"vLLM {version}: {reason}")
    if answer.get("args_error"):
        raise ScenarioError(file, "server.args", f"vLLM {version}'s argument parser: {answer['args_error']}")
    if answer.get("variant_args_error"):
        where = f"variants.{variant.name}.args"
        raise ScenarioError(file, where, f"vLLM {version}'s argument parser: {answer['variant_args_error']}")


def validate_variant(
    scenario: Scenario,
    variant: Variant,
    engine: EngineInfo,
    model: str,
    cache: Path | None,
    events: Events,
) -> None:
    answer = ask_engine(engine, request_for(scenario, variant, model), cache)
    if isinstance(answer, str):
        events(Event(f"vLLM could not check the scenario's keys and arguments ({answer}); going on", variant.name))
        return
    check_answer(scenario, variant, answer)
