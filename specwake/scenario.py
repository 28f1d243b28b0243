"""Scenario files: TOML → one strict, frozen Scenario, with command-line overrides merged in.

Every problem becomes a ScenarioError that renders as one line: ``file: key.path: reason``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specwake.errors import ScenarioError
from specwake.verdict import DEFAULT_TOLERANCE, EXPECTATIONS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# A scenario or variant name names a folder: one path component, nothing that could climb out of --output.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

# Flags specwake sets itself; a scenario's `server.args` may not override them.
RESERVED_FLAGS = {
    "--host": "servers bind to 127.0.0.1 only",
    "--port": "specwake picks a free port per server",
    "--worker-extension-cls": "specwake's worker extension is required for info and discard",
    "--speculative-config": "use the [speculative] table",
    "--model": "use server.model",
    "--tensor-parallel-size": "use server.tensor_parallel_size or --tp",
    "-tp": "use server.tensor_parallel_size or --tp",
    "--enable-sleep-mode": "specwake enables sleep mode where the platform supports it",
}

# Numeric keys of [expect] besides the per-variant expectations: allowed range [low, high).
EXPECT_NUMBERS = {"tolerance": (0.0, 1.0), "min_speedup_recovery": (0.0, 1.5)}

BUILTIN_PROMPTS = {
    "mixed": (
        "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
        "Explain in three sentences why the sky is blue.",
        "List the first ten prime numbers and say how you checked each one.",
        "Summarise the plot of a heist story set on a night train across the Alps.",
        "Translate to French: The meeting moved to Thursday because the room was booked.",
        "Give step-by-step instructions to make a cup of green tea.",
    ),
}


def _args_is_list(value: Any) -> Any:
    if isinstance(value, str):
        raise ValueError('must be a list of strings, not one shell string (e.g. ["--seed", "0"])')
    return value


def _no_reserved_flags(value: list[str]) -> list[str]:
    for arg in value:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_FLAGS:
            raise ValueError(f"{flag!r} is set by specwake ({RESERVED_FLAGS[flag]})")
    return value


def _env_values_are_strings(value: Any) -> Any:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(item, str):
                raise ValueError(f"value of {key!r} must be a string, got {type(item).__name__}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ServerSection(_Strict):
    model: str = Field(min_length=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enforce_eager: bool = False
    dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=900, gt=0)

    _args_list = field_validator("args", mode="before")(_args_is_list)
    _args_free = field_validator("args")(_no_reserved_flags)
    _env = field_validator("env", mode="before")(_env_values_are_strings)


class WorkloadSection(_Strict):
    prompts: str | list[str] = "builtin:mixed"
    max_tokens: int = Field(default=256, gt=0)
    repeats: int = Field(default=3, gt=0)
    warmup: int = Field(default=1, ge=0)
    temperature: float = Field(default=0.0, ge=0)
    ignore_eos: bool = True
    request_timeout_s: float = Field(default=300, gt=0)


class CycleSection(_Strict):
    level: Literal[1, 2] = 2
    count: int = Field(default=2, ge=1)
    discard: Literal["auto", "native", "emulated"] = "auto"
    # What an emulated discard leaves in the parameters. A real L2 wake on CUDA hands back memory it did not
    # clear, so a drafter that is never reloaded holds undefined values there, not zeros.
    discard_fill: Literal["zero", "nan", "random"] = "zero"
    step_timeout_s: float = Field(default=300, gt=0)


class VariantSection(_Strict):
    patch: str | None = None
    python: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Extra server arguments of this variant, after server.args: e.g. vLLM's own workaround,
    # ["--sleep-preserve-parameter-names", "draft.*"].
    args: list[str] = Field(default_factory=list)
    # false: the same server without --speculative-config, measured the same way — the no-speculation floor a
    # collapse falls to. Its outcome is `floor`, never judged.
    speculative: bool = True

    _args_list = field_validator("args", mode="before")(_args_is_list)
    _args_free = field_validator("args")(_no_reserved_flags)
    _env = field_validator("env", mode="before")(_env_values_are_strings)


class ScenarioFile(_Strict):
    """The TOML document as written (paths still relative to the file)."""

    name: str | None = None
    description: str = ""
    server: ServerSection
    speculative: dict[str, Any]
    workload: WorkloadSection = WorkloadSection()
    cycle: CycleSection = CycleSection()
    variants: dict[str, VariantSection] = Field(default_factory=lambda: {"baseline": VariantSection()})
    expect: dict[str, Any] = Field(default_factory=dict)

    @field_validator("speculative")
    @classmethod
    def _speculative(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("method"), str) or not value["method"]:
            raise ValueError('needs a `method` string (e.g. "eagle3", "mtp", "draft_model")')
        k = value.get("num_speculative_tokens")
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise ValueError("num_speculative_tokens must be an integer >= 1")
        return value

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, value: dict[str, VariantSection]) -> dict[str, VariantSection]:
        if not value:
            raise ValueError("needs at least one variant")
        for name in value:
            if not SAFE_NAME.fullmatch(name):
                raise ValueError(f"variant name {name!r} may use only letters, digits, '_', '.', '-'")
        return value

    @model_validator(mode="after")
    def _expectations(self) -> ScenarioFile:
        for key, value in self.expect.items():
            if key in EXPECT_NUMBERS:
                low, high = EXPECT_NUMBERS[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
                    raise ValueError(f"expect.{key}: must be a number in [{low:g}, {high:g})")
                continue
            if key not in self.variants:
                hint = _did_you_mean(key, [*self.variants, *EXPECT_NUMBERS])
                raise ValueError(f"expect.{key}: no variant named {key!r}{hint}")
            if value not in EXPECTATIONS:
                raise ValueError(f"expect.{key}: must be one of {', '.join(EXPECTATIONS)} (got {value!r})")
        return self


@dataclass(frozen=True)
class Variant:
    name: str
    patch: Path | None  # absolute
    python: str | None  # None: the interpreter running specwake
    env: dict[str, str]
    expected: str
    args: tuple[str, ...] = ()
    speculative: bool = True


@dataclass(frozen=True)
class Scenario:
    """A validated scenario with overrides applied and paths resolved."""

    name: str
    file: Path
    sha256: str
    doc: ScenarioFile
    prompts: tuple[str, ...]
    variants: tuple[Variant, ...]
    tolerance: float
    min_speedup_recovery: float | None = None  # None: not set (see verdict.speed_rule)

    @property
    def server(self) -> ServerSection:
        return self.doc.server

    @property
    def workload(self) -> WorkloadSection:
        return self.doc.workload

    @property
    def cycle(self) -> CycleSection:
        return self.doc.cycle

    @property
    def speculative(self) -> dict[str, Any]:
        return self.doc.speculative

    def settings(self) -> dict[str, Any]:
        """The resolved settings, JSON-ready, for result files."""
        data = self.doc.model_dump(mode="json")
        data["name"] = self.name
        data["variants"] = {
            v.name: {
                "patch": str(v.patch) if v.patch else None,
                "python": v.python,
                "env": v.env,
                "args": list(v.args),
                "speculative": v.speculative,
            }
            for v in self.variants
        }
        data["expect"] = {v.name: v.expected for v in self.variants} | {
            "tolerance": self.tolerance,
            "min_speedup_recovery": self.min_speedup_recovery,
        }
        return json.loads(json.dumps(data))


@dataclass(frozen=True)
class Overrides:
    """Command-line flags that override scenario files."""

    cycles: int | None = None
    tp: int | None = None
    variants: tuple[str, ...] = ()
    patch: Path | None = None


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _error_from_validation(file: str, exc: ValidationError, doc_keys: dict[str, Any]) -> ScenarioError:
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        *parent, key = [str(p) for p in err["loc"]]
        allowed = _allowed_keys(parent)
        msg = f"unknown key{_did_you_mean(key, allowed)}"
    elif err["type"] == "missing":
        msg = "is required"
    more = len(exc.errors()) - 1
    if more:
        msg += f" (+{more} more problem{'s' if more > 1 else ''})"
    if msg.startswith("expect."):  # model-level check already carries its key
        loc, msg = msg.split(": ", 1)
    return ScenarioError(file, loc, msg)


def _allowed_keys(parent: list[str]) -> list[str]:
    model: type[BaseModel] = ScenarioFile
    sections: dict[str, type[BaseModel]] = {"server": ServerSection, "workload": WorkloadSection, "cycle": CycleSection}
    if parent and parent[0] in sections:
        model = sections[parent[0]]
    elif parent and parent[0] == "variants":
        model = VariantSection
    return list(model.model_fields)


def _load_prompts(file: Path, spec: str | list[str]) -> tuple[str, ...]:
    key = "workload.prompts"
    if isinstance(spec, list):
        if not spec or not all(p.strip() for p in spec):
            raise ScenarioError(str(file), key, "prompt list must be non-empty and have no empty prompts")
        return tuple(spec)
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name not in BUILTIN_PROMPTS:
            raise ScenarioError(
                str(file),
                key,
                f"unknown builtin prompt set {name!r} (have: {', '.join(BUILTIN_PROMPTS)})",
            )
        return BUILTIN_PROMPTS[name]
    path = (file.parent / spec).expanduser()
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError(str(file), key, f"prompts file not found: {path}") from None
    except UnicodeDecodeError:
        raise ScenarioError(str(file), key, f"prompts file is not UTF-8: {path}") from None
    except OSError as exc:
        raise ScenarioError(str(file), key, f"cannot read prompts file {path}: {exc.strerror}") from None
    if path.suffix == ".jsonl":
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ScenarioError(str(file), key, f"{path}:{n}: invalid JSON ({exc.msg})") from None
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
                raise ScenarioError(str(file), key, f'{path}:{n}: expected an object with a "prompt" string')
            prompts.append(item["prompt"])
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ScenarioError(str(file), key, f"prompts file has no prompts: {path}")
    return tuple(prompts)


def _apply_overrides(raw: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    if overrides.cycles is not None:
        raw.setdefault("cycle", {})["count"] = overrides.cycles
    if overrides.tp is not None and isinstance(raw.get("server"), dict):
        raw["server"]["tensor_parallel_size"] = overrides.tp
        spec = raw.get("speculative")
        if isinstance(spec, dict) and "draft_tensor_parallel_size" in spec:
            raw["speculative"] = {**spec, "draft_tensor_parallel_size": overrides.tp}
    return raw


def load_scenario(path: Path | str, overrides: Overrides = Overrides()) -> Scenario:
    """Read, validate and resolve one scenario file. Raises ScenarioError (one line)."""
    file = Path(path)
    shown = str(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise ScenarioError(shown, "", "scenario file not found") from None
    except OSError as exc:
        raise ScenarioError(shown, "", f"cannot read: {exc.strerror}") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ScenarioError(shown, "", "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(shown, "", f"invalid TOML: {exc}") from None
    raw = _apply_overrides(raw, overrides)
    try:
        doc = ScenarioFile.model_validate(raw)
    except ValidationError as exc:
        raise _error_from_validation(shown, exc, raw) from None

    variants = dict(doc.variants)
    if overrides.patch is not None and "patched" not in variants:
        variants["patched"] = VariantSection()
    if overrides.variants:
        for name in overrides.variants:
            if name not in variants:
                raise ScenarioError(shown, "--variant", f"no variant {name!r} (have: {', '.join(variants)})")
        variants = {n: v for n, v in variants.items() if n in overrides.variants}

    name = doc.name if doc.name is not None else file.stem
    if not SAFE_NAME.fullmatch(name):
        origin = "" if doc.name is not None else " (taken from the file name; set `name` in the file)"
        raise ScenarioError(
            shown,
            "name",
            f"{name!r} must be one safe path component — letters, digits, '_', '.', '-' — as it names the run"
            f" folder{origin}",
        )
    resolved = []
    for name_, section in variants.items():
        patch = _resolve_patch(shown, file, name_, section, overrides)
        python = section.python
        if python and ("/" in python or python.startswith("~")):
            python = str((file.parent / Path(python).expanduser()).resolve())
        expected = doc.expect.get(name_, "any")
        if not section.speculative and expected != "any":
            raise ScenarioError(
                shown, f"expect.{name_}", f"{name_!r} runs without speculation (the floor): it is measured, not judged"
            )
        resolved.append(
            Variant(name_, patch, python, dict(section.env), expected, tuple(section.args), section.speculative)
        )

    tolerance = float(doc.expect.get("tolerance", DEFAULT_TOLERANCE))
    min_speedup = doc.expect.get("min_speedup_recovery")
    return Scenario(
        name=name,
        file=file.resolve(),
        sha256=hashlib.sha256(data).hexdigest(),
        doc=doc,
        prompts=_load_prompts(file, doc.workload.prompts),
        variants=tuple(resolved),
        tolerance=tolerance,
        min_speedup_recovery=None if min_speedup is None else float(min_speedup),
    )


def _resolve_patch(shown: str, file: Path, name: str, section: VariantSection, overrides: Overrides) -> Path | None:
    if name == "patched" and overrides.patch is not None:
        patch, key = overrides.patch.expanduser().resolve(), "--patch"
    elif section.patch:
        patch, key = (
            (file.parent / Path(section.patch).expanduser()).resolve(),
            f"variants.{name}.patch",
        )
    else:
        return None
    if not patch.is_file():
        raise ScenarioError(shown, key, f"patch file not found: {patch}")
    return patch
