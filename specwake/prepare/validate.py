"""Before anything starts: a scenario's `[speculative]` table and server arguments checked by the variant's own vLLM
(specwake.worker.validate, run in its interpreter), so a typo is exit 2 naming the file and key, not a server that
fails after minutes on a GPU. One process per interpreter answers for every file of a run or a `check`, and every
file with a problem gets its line. Answers are cached per installation, request and validation program (a specwake
that checks differently asks again); a vLLM that cannot answer (too old, or not a real vLLM) only costs the check,
never the run.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwake.errors import ScenarioError, ScenarioErrors
from specwake.events import Event, Events
from specwake.files import write_cache
from specwake.prepare.checkpoint import validate_entries
from specwake.prepare.engine import EngineInfo, install_stamp
from specwake.prepare.models import builder_env
from specwake.prepare.plan import INSPECT_IN_PROCESS, TRITON_ON_CPU, model_flags, speculative_config
from specwake.prepare.prompts import probe_prompt
from specwake.prepare.scenario import Scenario, Variant
from specwake.prepare.scenario_file import did_you_mean
from specwake.prepare.speculation import REQUESTS_AT_ONCE, check_speculation, speculation_line
from specwake.weight_updates import TRANSFER_FLAG

TIMEOUT_S = 300.0
PREFIX = "SPECWAKE_VALIDATE "
PROGRAM = Path(__file__).resolve().parents[1] / "worker" / "validate.py"  # run in the variant's interpreter


@functools.cache
def _program_digest() -> str:
    """The validation program's own text, part of every cached answer's key."""
    return hashlib.sha256(PROGRAM.read_bytes()).hexdigest()


CHECKED_PORT = 29500  # a multi-node group's ports as the check builds vLLM's config: any valid one (not used)


def request_for(
    scenario: Scenario, variant: Variant, model: str, draft_model: str | None = None, is_gpu: bool = False
) -> dict[str, Any]:
    """What the variant's vLLM is asked to check: the [speculative] table, the server arguments, every prompt the
    run sends (the scenario's and specwake's prefix-cache probe) against max_model_len. (push_scale and push_skip
    names are checked against the checkpoints without vLLM: specwake.prepare.checkpoint.)"""
    return {
        "model": model,
        "speculative": speculative_config(scenario, draft_model) if variant.speculative else {},
        "args": list(scenario.server.args),
        "variant_args": list(variant.args),
        "serve_args": [*model_flags(scenario, is_gpu, CHECKED_PORT), *scenario.server.args, *variant.args],
        "prompts": [*scenario.prompts, probe_prompt(scenario.cycle.count)],
        "max_model_len": scenario.server.max_model_len,
        "syncs": scenario.cycle.reload_kind.syncs,
        "draft_session": scenario.cycle.reload_kind.syncs and "draft" in variant.push_to,
        "model_runner": variant.model_runner,
        "batch_size": REQUESTS_AT_ONCE,
    }


def _cache_file(cache: Path | None, stamp: str | None, request: dict[str, Any]) -> Path | None:
    if cache is None or stamp is None:
        return None
    key = hashlib.sha256(json.dumps([stamp, _program_digest(), request], sort_keys=True).encode()).hexdigest()[:24]
    return cache / "validations" / f"{key}.json"


def _read(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        answer: dict[str, Any] = json.loads(path.read_text())
        return answer
    except (OSError, ValueError):
        return None


def ask_engine(engine: EngineInfo, requests: list[dict[str, Any]], cache: Path | None) -> list[dict[str, Any]] | str:
    """vLLM's answer to each request, in order (cached ones from the cache, the rest from one process), or why it
    could not answer (a str)."""
    stamp = install_stamp(engine.python) if cache is not None else None
    files = [_cache_file(cache, stamp, request) for request in requests]
    answers = [_read(path) for path in files]
    missing = [i for i, answer in enumerate(answers) if answer is None]
    if not missing:
        return [a for a in answers if a is not None]
    # Never a download: what is not on this machine is skipped and said so (HF_HUB_OFFLINE also spares the retries).
    env = builder_env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}) | {"HF_HUB_OFFLINE": "1"}
    if not engine.is_gpu:  # vLLM's model inspection in the validating process, as in a CPU server (plan.py)
        env.setdefault(INSPECT_IN_PROCESS, "1")
        env.setdefault(TRITON_ON_CPU, "1")  # and vLLM's choice of model runner, as such a server's
    try:
        proc = subprocess.run(
            [engine.python, "-m", "specwake.worker.validate"],
            input=json.dumps([requests[i] for i in missing]), capture_output=True, text=True, timeout=TIMEOUT_S,
            env=env,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(PREFIX)), None)
    if proc.returncode != 0 or line is None:
        return (proc.stderr.strip().splitlines() or ["no answer"])[-1]
    for i, answer in zip(missing, json.loads(line.removeprefix(PREFIX)), strict=True):
        answers[i] = answer
        path = files[i]
        if path is not None:
            write_cache(path, json.dumps(answer))
    return [a for a in answers if a is not None]


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
        choices = list((answer.get("choices") or {}).get(key) or [])
        if choices:  # not vLLM's list of every name (39 methods in 0.32): the nearest
            reason = not_a_choice(scenario.speculative.get(key), choices)
        raise ScenarioError(file, f"speculative.{key}", f"vLLM {version}: {reason}")
    if answer.get("args_error"):
        raise ScenarioError(file, "server.args", f"vLLM {version}'s argument parser: {answer['args_error']}")
    if answer.get("variant_args_error"):
        where = f"variants.{variant.name}.args"
        raise ScenarioError(file, where, f"vLLM {version}'s argument parser: {answer['variant_args_error']}")
    check_speculation(scenario, variant, answer.get("speculation"), version)
    long = answer.get("too_long")
    if isinstance(long, dict):
        index, tokens, limit = int(long["index"]), int(long["tokens"]), int(long["limit"])
        if index < len(scenario.prompts):
            what, key = f"prompt {index + 1} is {tokens} tokens", "workload.prompts"
        else:  # specwake's own prefix-cache probe, the last prompt asked about
            what, key = f"specwake's prefix-cache probe is {tokens} tokens", "server.max_model_len"
        raise ScenarioError(
            file, key, f"{what}, longer than max_model_len {limit}: the server would refuse it (HTTP 400)"
        )
    if answer.get("transfer_problem"):
        problem = str(answer["transfer_problem"])
        if problem.startswith(TRANSFER_FLAG):
            where = f"variants.{variant.name}.args" if TRANSFER_FLAG in " ".join(variant.args) else "server.args"
            raise ScenarioError(file, where, f"vLLM {version}: {problem}")
        raise ScenarioError(file, "cycle.reload", f'"{scenario.cycle.reload}": vLLM {version}: {problem}')
    if answer.get("runner_problem"):
        key = variant.model_runner_from
        asked = f'"{variant.model_runner}"' if variant.model_runner else "vLLM's choice"
        raise ScenarioError(file, key, f"{asked}: vLLM {version} refuses it: {answer['runner_problem']}")
    if answer.get("semantic_problem"):
        problem = str(answer["semantic_problem"])
        reason = f"vLLM {version}'s SpeculativeConfig refuses it: {problem}"
        raise ScenarioError(file, _semantic_key(scenario, problem), reason)


def not_a_choice(value: Any, choices: list[str]) -> str:
    """`'eagle4' is not one of its 39 methods (did you mean 'eagle3'?)`, or the three nearest where none is close."""
    word = str(value)
    hint = did_you_mean(word, choices)
    if not hint:
        nearest = difflib.get_close_matches(word, choices, n=3, cutoff=0)
        hint = f" (nearest: {', '.join(map(repr, nearest))})"
    return f"{value!r} is not one of its {len(choices)} choices{hint}"


def _semantic_key(scenario: Scenario, problem: str) -> str:
    """The key a refusal of vLLM's SpeculativeConfig is about: a tensor-parallel size the drafter's heads do not
    divide into is the draft's own size where the table sets one, else the server's (the drafter takes the target's);
    anything else, the [speculative] table."""
    if "draft_tensor_parallel_size" in problem:
        return "speculative.draft_tensor_parallel_size"
    if "tensor parallel size" in problem.lower() or "tensor_parallel_size" in problem:
        if "draft_tensor_parallel_size" in scenario.speculative:
            return "speculative.draft_tensor_parallel_size"
        return "server.tensor_parallel_size"
    return "speculative"


# A variant to check, its engine, and its model and drafter references as the server gets them.
Check = tuple[Scenario, Variant, EngineInfo, str, str | None]


@dataclass(frozen=True)
class Checked:
    """What a variant's vLLM said of it that `check` shows: the model runner it chooses ("v1" or "v2"), and the K in
    force at the workload's concurrency (specwake.prepare.speculation); None where it could not say."""

    runner: str | None = None
    speculation: str | None = None


def validate_variants(checks: Sequence[Check], cache: Path | None, events: Events) -> dict[tuple[str, str], Checked]:
    """Check every variant of a run before anything starts: its push_scale and push_skip names against the
    checkpoints (specwake.prepare.checkpoint), then its scenario by its own vLLM, one process per interpreter for the
    whole run (every file of `check a.toml b.toml …` in one import of vLLM). Raises the first problem of each
    scenario file, in the order given: a ScenarioError, or ScenarioErrors for several files. A vLLM that cannot
    answer is reported and skipped. Returns what vLLM said of each variant it could check, by (scenario file, variant
    name): the model runner it chose and the K in force."""
    problems: dict[str, ScenarioError] = {}
    for file in dict.fromkeys(str(s.file) for s, *_ in checks):
        try:
            validate_entries([(s, v, model, draft) for s, v, _, model, draft in checks if str(s.file) == file], events)
        except ScenarioError as exc:
            problems[file] = exc
    asked = [i for i, (scenario, *_) in enumerate(checks) if str(scenario.file) not in problems]
    by_python: dict[str, list[int]] = {}
    for index in asked:
        by_python.setdefault(checks[index][2].python, []).append(index)
    answers: dict[int, dict[str, Any]] = {}
    for indices in by_python.values():
        requests = [
            request_for(checks[i][0], checks[i][1], checks[i][3], checks[i][4], checks[i][2].is_gpu) for i in indices
        ]
        got = ask_engine(checks[indices[0]][2], requests, cache)
        if isinstance(got, str):
            for i in indices:
                note = f"vLLM could not check the scenario's keys and arguments ({got}); going on"
                events(Event(note, checks[i][1].name))
            continue
        answers.update(zip(indices, got, strict=True))
    for index in asked:
        scenario, variant = checks[index][:2]
        if index not in answers or str(scenario.file) in problems:
            continue
        try:
            check_answer(scenario, variant, answers[index])
        except ScenarioError as exc:
            problems[str(scenario.file)] = exc
            continue
        for reason in answers[index].get("skipped") or []:
            events(Event(f"not checked: {reason}", variant.name))
    if len(problems) == 1:
        raise next(iter(problems.values()))
    if problems:
        raise ScenarioErrors(list(problems.values()))
    return {
        (str(checks[i][0].file), checks[i][1].name): Checked(
            answers[i].get("runner") or None, speculation_line(answers[i].get("speculation"))
        )
        for i in asked
        if i in answers
    }
