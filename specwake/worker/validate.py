"""Checks a scenario's `[speculative]` table and extra server arguments with vLLM's own classes, in the variant's
interpreter, without starting a server: ``python -m specwake.worker.validate < requests.json``. One process answers
every variant of a run that uses this interpreter: importing vLLM takes seconds, checking takes milliseconds.

Requests: a JSON list of {"model": str, "speculative": {...}, "args": [...], "variant_args": [...]}. Answer (one
line): a list, in order, of {"vllm": version, "valid_keys": [...], "unknown_keys": [...], "bad_values": {key: reason},
"args_error": str|null, "variant_args_error": str|null} — the variant's arguments are parsed after the server's.
SpeculativeConfig is a pydantic dataclass with extra keys forbidden, but vLLM validates it only when it builds the
engine config, minutes into a GPU start; `--speculative-config` itself is parsed as plain JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# Fields vLLM fills in itself; a scenario cannot set them.
INTERNAL_FIELDS = {"target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config"}


def speculative_problems(spec: dict[str, Any]) -> dict[str, Any]:
    from pydantic import TypeAdapter, ValidationError
    from vllm.config.speculative import SpeculativeConfig

    fields: dict[str, Any] = SpeculativeConfig.__pydantic_fields__  # type: ignore[attr-defined]
    valid = sorted(name for name in fields if name not in INTERNAL_FIELDS)
    unknown, bad = [], {}
    for key, value in spec.items():
        name = key.replace("-", "_")  # vLLM accepts dashed keys too
        if name not in valid:
            unknown.append(key)
            continue
        try:
            TypeAdapter(fields[name].annotation).validate_python(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            bad[key] = str(first.get("msg", exc)).splitlines()[0]
    return {"valid_keys": valid, "unknown_keys": unknown, "bad_values": bad}


def args_problem(model: str, args: list[str]) -> str | None:
    """vLLM's own `vllm serve` argument parser over `args`; its error message, or None."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # 0.33
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # 0.32

    class Parser(FlexibleArgumentParser):
        def error(self, message: str) -> Any:  # argparse would print usage and exit 2
            raise ValueError(message)

    try:
        make_arg_parser(Parser(prog="vllm serve")).parse_args([model, *args])
    except (ValueError, SystemExit) as exc:
        return str(exc) or type(exc).__name__
    return None


def answer(request: dict[str, Any], version: str) -> dict[str, Any]:
    found: dict[str, Any] = {"vllm": version}
    found.update(speculative_problems(request.get("speculative") or {}))
    args = list(request.get("args") or [])
    found["args_error"] = args_problem(request["model"], args)
    extra = list(request.get("variant_args") or [])
    found["variant_args_error"] = (
        args_problem(request["model"], [*args, *extra]) if extra and not found["args_error"] else None
    )
    return found


def main() -> int:
    requests = json.loads(sys.stdin.read())
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    print("SPECWAKE_VALIDATE " + json.dumps([answer(request, version) for request in requests]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
