"""Checks a scenario's `[speculative]` table and extra server arguments with vLLM's own classes, in the variant's
interpreter, without starting a server: ``python -m specwake.worker.validate < requests.json``. One process answers
every variant of a run that uses this interpreter: importing vLLM takes seconds, checking takes milliseconds.

Requests: a JSON list of {"model": str, "speculative": {...}, "args": [...], "variant_args": [...], "prompts": [...],
"max_model_len": int|null, "syncs": bool, "draft_session": bool, "batch_size": int}.
Answer (one line): a list, in order, of {"vllm": version, "valid_keys": [...], "unknown_keys": [...], "bad_values":
{key: reason}, "choices": {key: [the values a Literal field allows], for a bad value of one}, "args_error":
str|null, "variant_args_error": str|null, "too_long": {"index": i, "tokens": n, "limit": max_model_len}|null,
"transfer_problem": str|null, "speculation": {...}|null (`speculation_in_force`), "skipped": [reason, ...]} — the
variant's arguments are parsed after the server's; prompts are counted with the model's own tokenizer where the model
is local (a folder, or the Hugging Face cache), and `skipped` says which of those checks could not run and why.
SpeculativeConfig is a pydantic dataclass with extra keys forbidden, but vLLM validates it only when it builds the
engine config, minutes into a GPU start; `--speculative-config` itself is parsed as plain JSON.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

from specwake.protocol import ADAPTIVE_FIELD, K_FIELD, METHOD_FIELD, SCHEDULE_FIELD

# Fields vLLM fills in itself; a scenario cannot set them.
INTERNAL_FIELDS = {"target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config"}


def speculative_problems(spec: dict[str, Any]) -> dict[str, Any]:
    from pydantic import TypeAdapter, ValidationError
    from vllm.config.speculative import SpeculativeConfig

    fields: dict[str, Any] = SpeculativeConfig.__pydantic_fields__  # type: ignore[attr-defined]
    valid = sorted(name for name in fields if name not in INTERNAL_FIELDS)
    unknown, bad, choices = [], {}, {}
    for key, value in spec.items():
        name = key.replace("-", "_")  # vLLM accepts dashed keys too
        if name not in valid:
            unknown.append(key)
            continue
        try:
            for parse in _before_validators(SpeculativeConfig, name):
                value = parse(value)
            TypeAdapter(fields[name].annotation).validate_python(value)
        except ValidationError as exc:
            bad[key] = str(exc.errors()[0].get("msg", exc)).splitlines()[0]
            if exc.errors()[0].get("type") == "literal_error":  # `method`: its names, for a "did you mean"
                choices[key] = literal_choices(fields[name].annotation)
        except (ValueError, TypeError, KeyError) as exc:  # a before-validator's refusal
            bad[key] = (str(exc) or type(exc).__name__).splitlines()[0]
    return {"valid_keys": valid, "unknown_keys": unknown, "bad_values": bad, "choices": choices}


def literal_choices(annotation: Any) -> list[str]:
    """The string values a field's Literal types allow, through unions and nested Literals (`method`:
    SpeculativeMethod | None, itself Literals of Literals)."""
    from typing import Literal, get_args, get_origin

    if get_origin(annotation) is Literal:
        return [a for a in get_args(annotation) if isinstance(a, str)]
    return [choice for member in get_args(annotation) for choice in literal_choices(member)]


def _before_validators(cls: Any, name: str) -> list[Any]:
    """The class's own "before" field validators of field `name` that take the value alone, as vLLM's config runs
    them ahead of the field's type: `attention_backend = "CPU_MLA"` is a name until one of them makes it the enum."""
    import inspect

    decorators = getattr(cls, "__pydantic_decorators__", None)
    found = []
    for decorator in getattr(decorators, "field_validators", {}).values():
        if decorator.info.mode != "before" or name not in decorator.info.fields:
            continue
        parse = getattr(cls, decorator.cls_var_name)
        if len(inspect.signature(parse).parameters) == 1:  # (value); one that also wants pydantic's info is left out
            found.append(parse)
    return found


@functools.cache
def _parser() -> Any:
    """vLLM's own `vllm serve` argument parser, raising ValueError where argparse would exit; built once per process
    (building it takes a tenth of a second, parsing with it almost nothing, and a run asks for every variant)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM < 0.33: the parser lives in vllm/entrypoints/launchers/cli_args.py
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str) -> Any:  # argparse would print usage and exit 2
            raise ValueError(message)

    return make_arg_parser(Parser(prog="vllm serve"))


def args_problem(model: str, args: list[str]) -> str | None:
    """vLLM's own `vllm serve` argument parser over `args`; its error message, or None."""
    try:
        _parser().parse_args([model, *args])
    except (ValueError, SystemExit) as exc:
        return str(exc) or type(exc).__name__
    return None


def local_folder(model: str | None) -> Path | None:
    """A model's files on this machine: its folder, or its snapshot in the Hugging Face cache (never a download)."""
    if not model:
        return None
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, not a repository id: the check is skipped, the run decides
        return None


def _max_model_len(folder: Path, asked: int | None) -> int | None:
    if asked is not None:
        return asked
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) else None


def too_long(model: str, prompts: list[str], asked: int | None) -> tuple[dict[str, int] | None, str | None]:
    """(the first prompt longer than max_model_len, counted with the model's own tokenizer as the server counts it;
    why the count was skipped). vLLM refuses a prompt of more tokens than max_model_len (HTTP 400,
    `renderers/params.py`) and clamps max_tokens to what is left, so only the prompt can fail."""
    folder = local_folder(model)
    if folder is None:
        return None, f"prompt lengths: {model} is not on this machine (no local folder or cached snapshot)"
    limit = _max_model_len(folder, asked)
    if limit is None:
        return None, "prompt lengths: no server.max_model_len and no max_position_embeddings in the model's config"
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        return None, f"prompt lengths: the model's tokenizer does not load ({type(exc).__name__})"
    for index, prompt in enumerate(prompts):
        count = len(tokenizer(prompt)["input_ids"])
        if count > limit:
            return {"index": index, "tokens": count, "limit": limit}, None
    return None, None


def _engine_args(model: str, spec: dict[str, Any], serve_args: list[str]) -> Any:
    """vLLM's EngineArgs as `vllm serve MODEL ARGS...` builds them, with `spec` as its speculative config."""
    from vllm.engine.arg_utils import EngineArgs

    parsed = _parser().parse_args([model, *serve_args])
    parsed.model = model  # what `vllm serve MODEL` does with its positional argument
    engine_args = EngineArgs.from_cli_args(parsed)
    engine_args.speculative_config = dict(spec) if spec else None
    return engine_args


def semantic_problem(model: str, spec: dict[str, Any], serve_args: list[str]) -> tuple[str | None, str | None]:
    """(what vLLM's own SpeculativeConfig refuses, why the check was skipped): the config built as the server builds
    it (EngineArgs from the same arguments, then create_speculative_config), which runs the checks of
    SpeculativeConfig.__post_init__ that a field check never reaches (K against a checkpoint's block size, a method
    the draft model does not support, ...). Needs the target and the drafter on this machine."""
    draft = spec.get("model")
    missing = [m for m in (model, draft) if isinstance(m, str) and local_folder(m) is None]
    if missing:
        return None, f"vLLM's SpeculativeConfig: {', '.join(missing)} not on this machine (no local folder or snapshot)"
    from vllm.config import ParallelConfig

    try:
        engine_args = _engine_args(model, spec, serve_args)
        target = engine_args.create_model_config()
    except Exception as exc:  # noqa: BLE001 - the target's own config is not this check's business
        return None, f"vLLM's SpeculativeConfig: the target's model config does not build here ({_first(exc)})"
    try:
        parallel = ParallelConfig(tensor_parallel_size=engine_args.tensor_parallel_size)
        engine_args.create_speculative_config(target, parallel)
    except Exception as exc:  # noqa: BLE001 - vLLM's own refusal, reported as one line
        return _first(exc), None
    return None, None


GUARDED = (METHOD_FIELD, ADAPTIVE_FIELD, K_FIELD, SCHEDULE_FIELD)  # what decides what AL measures
# VllmConfig's step that drops a batch-size schedule where data_parallel_size > 1 (data-parallel ranks could pick
# different K and deadlock), falling back to num_speculative_tokens for every batch size (vllm/config/vllm.py, 0.32+).
SCHEDULE_DROP = "_maybe_disable_dynamic_sd_for_data_parallel"


def _as_served(model: str, spec: dict[str, Any], args: list[str]) -> dict[str, Any]:
    """The speculative config the server gets, read by vLLM's own parser from its argv in specwake's order:
    `--speculative-config` (the [speculative] table), then `args`, where a later `--speculative-config`, `-sc` or
    `--speculative-config.KEY VALUE` replaces it. Dashed keys as vLLM reads them."""
    parsed = _parser().parse_args([model, "--speculative-config", json.dumps(spec), *args])
    return {str(k).replace("-", "_"): v for k, v in (getattr(parsed, "speculative_config", None) or {}).items()}


def speculation_in_force(
    model: str,
    spec: dict[str, Any],
    args: list[str],
    variant_args: list[str],
    batch_size: int,
    data_parallel_size: int = 1,
) -> dict[str, Any]:
    """What decides the variant's AL, as its server will have it: the rejection sampling method, adaptive
    verification, and K at `batch_size` requests at once, each field as served (`_as_served`) or else its default in
    this release's SpeculativeConfig (None: the release has no such field), and K at that batch size from vLLM's own
    lookup of the schedule (vllm/v1/spec_decode/dynamic/utils.py, as its scheduler builds it). `set_by` says, per
    field, which of "speculative", "args" (server.args) or "variant_args" gave its value. Where the release drops
    the schedule under data parallelism (SCHEDULE_DROP) and the server has `data_parallel_size` engines in one group,
    K is num_speculative_tokens and `schedule_dropped` says why."""
    from vllm.config.speculative import SpeculativeConfig

    fields: dict[str, Any] = SpeculativeConfig.__pydantic_fields__  # type: ignore[attr-defined]
    table = {str(k).replace("-", "_"): v for k, v in spec.items()}
    served, with_variant = _as_served(model, spec, args), _as_served(model, spec, [*args, *variant_args])

    def value(name: str) -> Any:
        if name in with_variant:
            return with_variant[name]
        return fields[name].get_default(call_default_factory=True) if name in fields else None

    def set_by(name: str) -> str:
        if with_variant.get(name) != served.get(name):
            return "variant_args"
        return "args" if served.get(name) != table.get(name) else "speculative"

    found: dict[str, Any] = {
        "fields": {name: value(name) for name in GUARDED if name in fields},
        "set_by": {name: set_by(name) for name in GUARDED},
        "batch_size": batch_size,
        "k_in_force": value(K_FIELD),
        "k_problem": None,
        "schedule_dropped": None,
    }
    schedule = value(SCHEDULE_FIELD)
    if schedule is not None and data_parallel_size > 1 and _drops_schedule():
        found["schedule_dropped"] = f"data_parallel_size {data_parallel_size}"
    elif schedule is not None:
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        k = value(K_FIELD)  # None: the drafter's config gives K (n_predict); the schedule alone then says
        try:
            lookup = build_dynamic_sd_schedule_lookup(schedule, batch_size, k if k else sys.maxsize)
            found["k_in_force"] = lookup[batch_size]
        except (ValueError, TypeError) as exc:  # vLLM's refusal of the schedule, which its scheduler raises at start
            found["k_in_force"], found["k_problem"] = None, _first(exc)
    return found


def data_parallel_size(model: str, serve_args: list[str]) -> int:
    """The engines of the server's data-parallel group, as vLLM's parser reads them from the server's arguments."""
    return int(getattr(_parser().parse_args([model, *serve_args]), "data_parallel_size", None) or 1)


def _drops_schedule() -> bool:
    """Whether this release's engine config drops a batch-size schedule under data parallelism (SCHEDULE_DROP)."""
    from vllm.config import VllmConfig

    return callable(getattr(VllmConfig, SCHEDULE_DROP, None))


V2_SWITCH = "VLLM_USE_V2_MODEL_RUNNER"  # plan.V2_SWITCH
RUNNER_SWITCH = {"v1": "0", "v2": "1"}  # plan.RUNNER_SWITCH
# The start of vLLM's refusals of a model runner (vllm/config/vllm.py, `_validate_v2_model_runner` and
# `_validate_v1_model_runner`; 0.34 has only V2, and says so in the worker).
RUNNER_REFUSALS = ("Model Runner V2 ", "Model Runner V1 ")


def runner_choice(
    model: str, spec: dict[str, Any], serve_args: list[str], asked: str | None
) -> tuple[str | None, str | None, str | None]:
    """(the model runner vLLM runs for this configuration, "v1" or "v2"; vLLM's refusal of the runner asked for; why
    the check was skipped). vLLM's whole engine config is built as the server builds it, with the server's
    VLLM_USE_V2_MODEL_RUNNER (`asked`: "v1", "v2", or None for vLLM's own choice): its `use_v2_model_runner` is the
    answer, and its validation of that runner raises the refusal. Needs the target (and the drafter) on this
    machine."""
    missing = [m for m in (model, spec.get("model")) if isinstance(m, str) and local_folder(m) is None]
    if missing:
        return None, None, f"model runner: {', '.join(missing)} not on this machine (no local folder or snapshot)"
    import os

    if asked in RUNNER_SWITCH:
        os.environ[V2_SWITCH] = RUNNER_SWITCH[asked]
    else:
        os.environ.pop(V2_SWITCH, None)
    try:
        config = _engine_args(model, spec, serve_args).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - vLLM's refusal of the runner, or a config this check cannot build
        text = _first(exc)
        if text.startswith(RUNNER_REFUSALS):
            return None, text, None
        return None, None, f"model runner: vLLM's engine config does not build here ({text})"
    # 0.34 has Model Runner V2 alone, and no such property (vllm/config/vllm.py 0.34)
    return ("v2" if getattr(config, "use_v2_model_runner", True) else "v1"), None, None


TRANSFER_SINCE = "vLLM 0.26"  # draft sessions (Worker.start_draft_weight_update); engine-owned sessions since 0.25


def transfer_problem(model: str, args: list[str], syncs: bool, draft_session: bool) -> str | None:
    """What stops a weight sync through vLLM's weight-transfer API here (`syncs`: the scenario's cycles sync), or a
    `--weight-transfer-config` in `args` whose backend is no engine of this vLLM: vLLM checks the name only in the
    worker, when it creates the engine after loading the model."""
    if syncs:
        try:
            from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # noqa: F401
            from vllm.v1.worker.gpu_worker import Worker
        except ImportError:
            return (
                f"this vLLM has no weight-transfer API (vllm.distributed.weight_transfer; syncs need {TRANSFER_SINCE})"
            )
        if draft_session and not hasattr(Worker, "start_draft_weight_update"):
            missing = "Worker.start_draft_weight_update"
            return f"its weight-transfer API has no draft sessions ({missing}; draft sessions need {TRANSFER_SINCE})"
        from specwake.worker.transfer import register

        if not register():
            return f"its weight-transfer engines do not run their own sessions (syncs need {TRANSFER_SINCE})"
    try:
        config = getattr(_parser().parse_args([model, *args]), "weight_transfer_config", None)
    except (ValueError, SystemExit):
        return None  # the argument parser's own error is reported as such
    if config is None:
        return None
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from specwake.worker.transfer import register

    register()
    known = sorted(WeightTransferEngineFactory._registry)
    if config.backend not in known:
        names = ", ".join(known)
        return f"--weight-transfer-config: backend {config.backend!r} is not a weight-transfer engine (known: {names})"
    return None


def _first(exc: BaseException) -> str:
    """One line of an exception: for pydantic's ValidationError, its first error's message (the class name alone
    says nothing), else the first line of its text."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            return str(first.get("msg", "")).removeprefix("Value error, ").splitlines()[0]
        except (IndexError, AttributeError, TypeError):
            pass
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def answer(request: dict[str, Any], version: str) -> dict[str, Any]:
    found: dict[str, Any] = {"vllm": version, "skipped": []}
    found.update(speculative_problems(request.get("speculative") or {}))
    args = list(request.get("args") or [])
    found["args_error"] = args_problem(request["model"], args)
    extra = list(request.get("variant_args") or [])
    found["variant_args_error"] = (
        args_problem(request["model"], [*args, *extra]) if extra and not found["args_error"] else None
    )
    spec = dict(request.get("speculative") or {})
    found["semantic_problem"] = None
    if spec and not found["unknown_keys"] and not found["bad_values"] and not found["args_error"]:
        found["semantic_problem"], skipped = semantic_problem(
            request["model"], spec, list(request.get("serve_args") or [])
        )
        found["skipped"] += [skipped] if skipped else []
    found["runner"] = found["runner_problem"] = None
    if not found["unknown_keys"] and not found["bad_values"] and not found["args_error"]:
        if not found["variant_args_error"] and not found["semantic_problem"]:
            found["runner"], found["runner_problem"], skipped = runner_choice(
                request["model"], spec, list(request.get("serve_args") or []), request.get("model_runner")
            )
            found["skipped"] += [skipped] if skipped else []
    found["speculation"] = None
    if spec and not found["unknown_keys"] and not found["bad_values"] and not found["args_error"]:
        if not found["variant_args_error"]:
            found["speculation"] = speculation_in_force(
                request["model"], spec, args, extra, int(request.get("batch_size") or 1),
                data_parallel_size(request["model"], list(request.get("serve_args") or [])),
            )  # fmt: skip
    prompts = list(request.get("prompts") or [])
    found["too_long"], skipped = (
        too_long(request["model"], prompts, request.get("max_model_len")) if prompts else (None, None)
    )
    found["skipped"] += [skipped] if skipped else []
    found["transfer_problem"] = None
    if not found["args_error"] and not found["variant_args_error"]:
        found["transfer_problem"] = transfer_problem(
            request["model"], [*args, *extra], bool(request.get("syncs")), bool(request.get("draft_session"))
        )
    return found


def main() -> int:
    requests = json.loads(sys.stdin.read())
    from specwake.worker.triton_cpu import interpret_triton_on_cpu

    interpret_triton_on_cpu()  # before vLLM is imported, as in a CPU server that may run Model Runner V2
    import vllm

    from specwake.worker.serve import inspect_models_in_process

    inspect_models_in_process()

    version = str(getattr(vllm, "__version__", "unknown"))
    print("SPECWAKE_VALIDATE " + json.dumps([answer(request, version) for request in requests]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
