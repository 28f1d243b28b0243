"""Scenario files: TOML → one strict, frozen Scenario, with command-line overrides merged in.

Every problem becomes a ScenarioError that renders as one line: ``file: key.path: reason``.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specwake.errors import ScenarioError
from specwake.verdict import DEFAULT_TOLERANCE, EXPECTATIONS, Limits

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# A scenario or variant name names a folder: one path component, nothing that could climb out of --output.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

LIMIT_KEYS = {f.name for f in dataclasses.fields(Limits)}

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

# Numeric keys of [expect] besides the per-variant expectations: allowed range [low, high), or (low, high)
# for those in POSITIVE (a floor of 0 would pass any speed).
EXPECT_NUMBERS = {
    "tolerance": (0.0, 1.0),
    "min_speedup_recovery": (0.0, 1.5),
    "max_logprob_drift": (0.0, math.inf),
    "max_rss_growth_mb": (0.0, math.inf),
    "max_wake_s": (0.0, math.inf),
}
POSITIVE = {"min_speedup_recovery", "max_wake_s"}

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
    repeats: int = Field(default=5, gt=0)  # measured requests per stage: 5 gives the speed rule power
    warmup: int = Field(default=1, ge=0)
    temperature: float = Field(default=0.0, ge=0)
    ignore_eos: bool = True
    request_timeout_s: float = Field(default=300, gt=0)


Level = Literal[1, 2]
PushTarget = Literal["target", "draft"]
_TARGET_ONLY: list[PushTarget] = ["target"]  # what most RL trainers push


def _distinct(value: Any) -> Any:
    if isinstance(value, list) and (not value or len(set(value)) != len(value)):
        raise ValueError("must list one or more distinct values")
    return value


class CycleSection(_Strict):
    # A list runs every variant once per level (its name gets "-L1", "-L2"): L1 and L2 side by side.
    level: Level | list[Level] = 2
    count: int = Field(default=2, ge=1)
    # How weights come back after the wake: vLLM's reload_weights from disk, or pushed into the live models
    # through load_weights, as RL trainers do (verl, NeMo-RL, TRL).
    reload: Literal["reload_weights", "push"] = "reload_weights"
    push_to: list[PushTarget] = Field(default_factory=lambda: _TARGET_ONLY.copy())
    discard: Literal["auto", "native", "emulated"] = "auto"
    # What an emulated discard leaves in the parameters. A real L2 wake on CUDA hands back memory it did not
    # clear, so a drafter that is never reloaded holds undefined values there, not zeros.
    discard_fill: Literal["zero", "nan", "random"] = "zero"
    step_timeout_s: float = Field(default=300, gt=0)

    _level = field_validator("level")(_distinct)
    _push_to = field_validator("push_to")(_distinct)

    @property
    def levels(self) -> list[int]:
        return list(self.level) if isinstance(self.level, list) else [self.level]


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
    push_to: list[PushTarget] | None = None  # with [cycle] reload = "push": this variant's push (default: cycle's)
    # A perturbed push: checkpoint tensor name → factor, applied to target and drafter alike. The output must then
    # change while AL stays: proof that the drafter follows the new weights.
    push_scale: dict[str, float] = Field(default_factory=dict)

    _args_list = field_validator("args", mode="before")(_args_is_list)
    _args_free = field_validator("args")(_no_reserved_flags)
    _env = field_validator("env", mode="before")(_env_values_are_strings)
    _push_to = field_validator("push_to")(_distinct)


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
                opening = "(" if key in POSITIVE else "["
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not low <= value < high
                    or (key in POSITIVE and value == low)
                ):
                    raise ValueError(f"expect.{key}: must be a number in {opening}{low:g}, {high:g})")
                continue
            levels = self.cycle.levels
            # NAME-L1 / NAME-L2 exist only when [cycle] level lists several levels.
            names = [*self.variants, *(f"{v}-L{lv}" for v in self.variants for lv in levels if len(levels) > 1)]
            if key not in names:
                hint = _did_you_mean(key, [*names, *EXPECT_NUMBERS])
                raise ValueError(f"expect.{key}: no variant named {key!r}{hint}")
            if value not in EXPECTATIONS:
                raise ValueError(f"expect.{key}: must be one of {', '.join(EXPECTATIONS)} (got {value!r})")
        return self

    @model_validator(mode="after")
    def _push_keys_need_push(self) -> ScenarioFile:
        if self.cycle.reload == "push":
            return self
        if "push_to" in self.cycle.model_fields_set:
            raise ValueError('cycle.push_to: only with cycle.reload = "push"')
        for name, section in self.variants.items():
            for key in ("push_to", "push_scale"):
                if key in section.model_fields_set:
                    raise ValueError(f'variants.{name}.{key}: only with cycle.reload = "push"')
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
    level: int = 2  # the sleep level its cycles use
    push_to: tuple[str, ...] = ("target",)  # with [cycle] reload = "push"
    push_scale: tuple[tuple[str, float], ...] = ()  # a perturbed push (see VariantSection)


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
    limits: Limits = Limits()

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
                "level": v.level,
                "push_to": list(v.push_to),
                "push_scale": dict(v.push_scale),
            }
            for v in self.variants
        }
        data["expect"] = {v.name: v.expected for v in self.variants} | {
            "tolerance": self.tolerance,
            "min_speedup_recovery": self.min_speedup_recovery,
            **dataclasses.asdict(self.limits),
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
    # A union adds its member's tag to the location ("cycle.level.literal[1,2]"): the key is what users wrote.
    loc = ".".join(str(part) for part in err["loc"] if "[" not in str(part))
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
    if msg.startswith(("expect.", "cycle.", "variants.")):  # a model-level check already carries its key
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
    if overrides.patch is not None:  # --patch names the `patched` variant; add it if the file has none
        variants = raw.get("variants", {"baseline": {}})
        if isinstance(variants, dict) and "patched" not in variants:
            raw["variants"] = {**variants, "patched": {}}
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
    doc = _local_models(file, doc)
    resolved = []
    levels = doc.cycle.levels
    for name_, section in variants.items():
        patch = _resolve_patch(shown, file, name_, section, overrides)
        python = section.python
        if python and ("/" in python or python.startswith("~")):
            python = str((file.parent / Path(python).expanduser()).resolve())
        for level in levels:
            full = name_ if len(levels) == 1 else f"{name_}-L{level}"
            expected = doc.expect.get(full, doc.expect.get(name_, "any"))
            if not section.speculative and expected != "any":
                raise ScenarioError(
                    shown, f"expect.{name_}", f"{name_!r} runs without speculation (the floor): measured, not judged"
                )
            push_to = tuple(section.push_to or doc.cycle.push_to)
            resolved.append(
                Variant(
                    full,
                    patch,
                    python,
                    dict(section.env),
                    expected,
                    tuple(section.args),
                    section.speculative,
                    level,
                    push_to,
                    tuple(sorted(section.push_scale.items())),
                )  # fmt: skip
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
        limits=Limits(**{k: float(v) for k, v in doc.expect.items() if k in LIMIT_KEYS}),
    )


def _local_path(file: Path, ref: str) -> str:
    """A model reference that is a path (./x, ../x, /x, ~/x) → absolute, relative to the scenario file, so a
    scenario runs the same from any directory; anything else (a Hub id, builtin:NAME) is returned as is."""
    if ref.startswith(("./", "../", "/", "~")):
        return str((file.parent / Path(ref).expanduser()).resolve())
    return ref


def _local_models(file: Path, doc: ScenarioFile) -> ScenarioFile:
    server = doc.server.model_copy(update={"model": _local_path(file, doc.server.model)})
    speculative = dict(doc.speculative)
    if isinstance(speculative.get("model"), str):
        speculative["model"] = _local_path(file, speculative["model"])
    return doc.model_copy(update={"server": server, "speculative": speculative})


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
