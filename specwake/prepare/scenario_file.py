"""The scenario file's format: every TOML key, its type, default and check, as strict pydantic models (what the
`args` and `env` tables may hold is checked by specwake.prepare.server_args).

This is the one definition of what a scenario may say (docs/scenario-format.md documents it key by key, and
tests/unit/test_docs.py checks that it does). specwake.prepare.scenario reads a file with these models and resolves it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from specwake.judge.expectations import Limits, expectation_text
from specwake.judge.sequential import DEFAULT_MIN_REPEATS
from specwake.prepare.releases import ByRelease
from specwake.prepare.server_args import args_is_list, env_values_are_strings, no_reserved_flags
from specwake.protocol import ROLES
from specwake.weight_updates import RELOAD_KIND, RELOAD_KINDS, TARGET_ALSO_TO_DRAFT, ReloadKind, split_entry

HOST = "127.0.0.1"
NODE_COMMAND, NODE_ARGV = "{command}", "{argv}"  # server.node_command's placeholders (and "{node}")

# A scenario or variant name names a folder: one path component, nothing that could climb out of --output.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

LIMIT_KEYS = {f.name for f in dataclasses.fields(Limits) if f.name != "graph_safe"}  # the numeric ones

NO_DRAFT_MODEL = {"ngram", "suffix"}  # speculative methods without a drafter model: nothing to push or sync into

# Numeric keys of [expect] besides the per-variant expectations: allowed range [low, high), or (low, high)
# for those in POSITIVE (a floor of 0 would pass any speed).
EXPECT_NUMBERS = {
    "tolerance": (0.0, 1.0),
    "min_speedup_recovery": (0.0, 1.5),
    "max_logprob_drift": (0.0, math.inf),
    "max_rss_growth_mb": (0.0, math.inf),
    "max_wake_s": (0.0, math.inf),
    "max_wake_ratio": (0.0, math.inf),
}
POSITIVE = {"min_speedup_recovery", "max_wake_s", "max_wake_ratio"}


# vLLM's model runners: "v2", Model Runner V2 (vllm/v1/worker/gpu/), what every GPU server of
# 0.32+ runs where the configuration allows it and 0.34's only one; "v1", the runner before it.
ModelRunner = Literal["v1", "v2"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ServerSection(_Strict):
    model: str = Field(min_length=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    # Engines behind the one API server (vLLM's internal load balancing), each with tensor_parallel_size ranks: every
    # one is slept, woken and measured; a variant is as good as its worst engine.
    data_parallel_size: int = Field(default=1, ge=1)
    enable_expert_parallel: bool = False  # MoE experts spread over the DP × TP ranks instead of tensor-parallel
    # Who spreads requests over the engines: "internal", one API server in front of them all (vLLM's own balancer);
    # "external", one API server per engine, all in one data-parallel group (vLLM's external load balancing, which
    # vLLM allows for mixture-of-experts models only); "replicas", one independent server per engine (what vLLM asks
    # of a dense model, the SkyRL layout). specwake is then the balancer: every control call goes to each server.
    load_balancing: Literal["internal", "external", "replicas"] = "internal"
    # Machines the ranks span (vLLM's own multi-node layout, --nnodes): the API server and its share of the ranks
    # here (the head), every other node its share headless, all meeting at head_address. node_command starts node i:
    # an argv template, "{node}" its index, "{command}" its vLLM command as one shell string (ssh), or an element
    # "{argv}" the command's own words (run on this machine: a test of the layout).
    nodes: int = Field(default=1, ge=1)
    head_address: str = Field(default=HOST, min_length=1)
    node_command: list[str] = Field(default_factory=list)
    enforce_eager: bool = False
    dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=900, gt=0)
    # The model runner each variant's server runs (a variant may set its own); omitted: the one vLLM picks for the
    # release and configuration, as on a GPU (on a CPU too: specwake.worker.triton_cpu).
    model_runner: ModelRunner | None = None

    _args_list = field_validator("args", mode="before")(args_is_list)
    _args_free = field_validator("args")(no_reserved_flags)
    _env = field_validator("env", mode="before")(env_values_are_strings)

    @model_validator(mode="after")
    def _balancing_needs_engines(self) -> ServerSection:
        if self.load_balancing != "internal" and self.data_parallel_size == 1:
            raise ValueError(
                f'load_balancing: "{self.load_balancing}" runs one server per engine; set data_parallel_size above 1'
            )
        return self

    @model_validator(mode="after")
    def _nodes_share_the_engines(self) -> ServerSection:
        if self.nodes == 1:
            if self.node_command:
                raise ValueError("node_command: only with nodes above 1")
            return self
        world = self.tensor_parallel_size * self.data_parallel_size
        if self.load_balancing != "internal" or world % self.nodes:
            raise ValueError(
                f"nodes: {self.nodes} nodes share the data_parallel_size × tensor_parallel_size = {world} ranks evenly"
                f' behind one API server; make that a multiple of {self.nodes}, with load_balancing = "internal"'
            )
        if not self.node_command:
            raise ValueError(
                f"node_command: needed with nodes = {self.nodes}: how specwake starts each other node, e.g."
                ' ["ssh", "-tt", "gpu-{node}", "{command}"] (`specwake check` prints each node\'s command)'
            )
        if not any(NODE_COMMAND in word or word == NODE_ARGV for word in self.node_command):
            raise ValueError(f'node_command: names no "{NODE_COMMAND}" and no "{NODE_ARGV}": nothing would run vLLM')
        return self

    @property
    def eager(self) -> bool:
        """The model runs eagerly (no CUDA graphs, no torch.compile): `enforce_eager`, or `--enforce-eager` in args."""
        return self.enforce_eager or "--enforce-eager" in self.args

    @property
    def nodes_here(self) -> bool:
        """The other nodes' engines run on this machine (node_command runs their argv itself: a test of the layout)."""
        return NODE_ARGV in self.node_command

    @property
    def ranks(self) -> int:
        """Devices a variant takes on this machine: a GPU, or on CPU a core, per rank of every engine (of every server)
        that runs here."""
        world = self.tensor_parallel_size * self.data_parallel_size
        return world if self.nodes_here else world // self.nodes

    @property
    def servers(self) -> int:
        """API servers a variant runs: one, or one per engine where specwake balances the load."""
        return 1 if self.load_balancing == "internal" else self.data_parallel_size

    @property
    def server_ranks(self) -> int:
        """Devices one of the variant's servers takes (a node's share, with nodes)."""
        return self.ranks // self.servers // (self.nodes if self.nodes_here else 1)


# The fewest tokens a request can ask for and still be drafted for: the prefill makes the first token, and only a
# decode step after it verifies a draft (vLLM counts the draft's accepted tokens even past max_tokens,
# v1/core/sched/scheduler.py update_from_output). With max_tokens 1 no draft is ever made: AL cannot be measured.
MIN_MAX_TOKENS = 2
# max_tokens of a warmup request unless workload.warmup_tokens says otherwise: its steps choose the first bets of a
# stage's early stop (a tiny pair's 16 tokens: 4 draft steps at AL 4.00, 15 at 1.00) and it runs every kernel a decode
# step does; it is not measured, so tokens beyond that only cost time (a collapsed stage decodes them one by one).
WARMUP_TOKENS = 16


class WorkloadSection(_Strict):
    prompts: str | list[str] = "builtin:mixed"
    max_tokens: int = Field(default=256, gt=0)
    repeats: int = Field(default=5, gt=0)  # measured requests per stage: 5 gives the speed rule power
    # A stage after a cycle measures at least this many and stops once AL is decided (at most `repeats`); None:
    # DEFAULT_MIN_REPEATS, or `repeats` where it is smaller. Equal to `repeats`: no early stop.
    min_repeats: int | None = Field(default=None, ge=1)
    warmup: int = Field(default=1, ge=0)
    warmup_tokens: int | None = None  # max_tokens of a warmup request; None: WARMUP_TOKENS, at most max_tokens
    temperature: float = Field(default=0.0, ge=0)
    ignore_eos: bool = True
    request_timeout_s: float = Field(default=300, gt=0)

    @field_validator("max_tokens", "warmup_tokens")
    @classmethod
    def _room_for_a_draft(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < MIN_MAX_TOKENS:
            lost = "AL cannot be measured" if info.field_name == "max_tokens" else "the first bets have no step"
            raise ValueError(
                f"must be at least {MIN_MAX_TOKENS}: the prefill makes the first token, so with {value} no decode step"
                f" verifies a draft and {lost}"
            )
        return value

    @field_validator("min_repeats")
    @classmethod
    def _within_repeats(cls, value: int | None, info: ValidationInfo) -> int | None:
        repeats = info.data.get("repeats")
        if value is not None and isinstance(repeats, int) and value > repeats:
            raise ValueError(f"must be at most workload.repeats ({repeats})")
        return value

    @property
    def warmup_max_tokens(self) -> int:
        """max_tokens of each warmup request."""
        return self.warmup_tokens if self.warmup_tokens is not None else min(WARMUP_TOKENS, self.max_tokens)

    @property
    def least_repeats(self) -> int:
        """The measured requests a stage after a cycle takes at least (min_repeats, or its default)."""
        return self.min_repeats if self.min_repeats is not None else min(DEFAULT_MIN_REPEATS, self.repeats)


Level = Literal[1, 2]
PushTarget = Literal["target", "draft"]
# weight_updates.PUSH_FAULTS (a unit test holds the two alike)
PushFault = Literal["draft-to-target", "empty-draft", "target-also-to-draft"]
_TARGET_ONLY: list[PushTarget] = ["target"]  # what most RL trainers push


def _one_of(allowed: list[str]) -> str:
    """`'a', 'b' or 'c'`, as pydantic words a Literal's choices."""
    quoted = [f"'{a}'" for a in allowed]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _reload_kind(value: str) -> str:
    if value not in RELOAD_KINDS:
        raise ValueError(f"Input should be {_one_of(list(RELOAD_KINDS))}")
    return value


def _distinct(value: Any) -> Any:
    if isinstance(value, list) and (not value or len(set(value)) != len(value)):
        raise ValueError("must list one or more distinct values")
    return value


def _entries(value: Any) -> Any:
    """push_scale keys and push_skip items: a checkpoint tensor name or glob, `target:` or `draft:` before it to
    limit it to one model (a tensor name never holds a colon)."""
    for entry in value:
        role, sep, pattern = entry.rpartition(":")
        if sep and role not in ROLES:
            raise ValueError(f"{entry!r}: only target: or draft: may come before a tensor name")
        if not pattern:
            raise ValueError(f"{entry!r}: names no tensor")
    if isinstance(value, list) and len(set(value)) != len(value):
        raise ValueError("lists an entry twice")
    return value


DiscardRules = Literal["0.33", "0.34"]  # protocol.DISCARD_RULES (a unit test holds the two alike)


class CycleSection(_Strict):
    # A list runs every variant once per level (its name gets "-L1", "-L2"): L1 and L2 side by side.
    level: Level | list[Level] = 2
    count: int = Field(default=2, ge=1)
    # How weights come back after the wake: vLLM's reload_weights from disk; pushed into the live models through
    # load_weights by specwake's worker extension, as RL trainers did (verl, NeMo-RL, TRL); or synced through vLLM's
    # own weight-transfer API, one session per model in push_to, as trainers do since vLLM 0.26 (SkyRL, vime).
    reload: str = RELOAD_KIND.name  # a name of weight_updates.RELOAD_KINDS
    push_to: list[PushTarget] = Field(default_factory=lambda: _TARGET_ONLY.copy())
    discard: Literal["auto", "native", "emulated"] = "auto"
    # What an emulated discard leaves in the parameters. A real L2 wake on CUDA hands back memory it did not
    # clear, so a drafter that is never reloaded holds undefined values there, not zeros.
    discard_fill: Literal["zero", "nan", "random"] = "zero"
    # Whose L2 sleep an emulated discard follows (protocol.DISCARD_RULES): "0.33" (vLLM 0.32/0.33: every parameter
    # and plain tensor attribute; buffers kept) or "0.34" (the storages of parameters only); each variant may set its
    # own. Omitted: the rules of the vLLM the variant runs.
    discard_rules: DiscardRules | None = None
    step_timeout_s: float = Field(default=300, gt=0)
    # Tensors a reload cannot reproduce bit for bit on this hardware, by name glob (target's or drafter's), each with
    # why: their fingerprints compare an order-sensitive projection within rounding, not their bits.
    inexact_tensors: dict[str, str] = Field(default_factory=dict)

    _level = field_validator("level")(_distinct)

    @field_validator("inexact_tensors")
    @classmethod
    def _each_says_why(cls, value: dict[str, str]) -> dict[str, str]:
        for glob, why in value.items():
            if not glob.strip() or not why.strip():
                raise ValueError(f"{glob!r}: a tensor name glob, and why a reload cannot reproduce it bit for bit")
        return value

    _push_to = field_validator("push_to")(_distinct)
    _reload = field_validator("reload")(_reload_kind)

    @property
    def levels(self) -> list[int]:
        return list(self.level) if isinstance(self.level, list) else [self.level]

    @property
    def reload_kind(self) -> ReloadKind:
        return RELOAD_KINDS[self.reload]


class VariantSection(_Strict):
    # a diff, or one per vLLM release: { "<0.34" = "patches/a.diff", ">=0.34" = "patches/b.diff" }
    # (specwake.prepare.releases.ByRelease)
    patch: str | dict[str, str] | None = None
    python: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Extra server arguments of this variant, after server.args: e.g. vLLM's own workaround,
    # ["--sleep-preserve-parameter-names", "draft.*"].
    args: list[str] = Field(default_factory=list)
    # false: the same server without --speculative-config, measured the same way — the no-speculation floor a
    # collapse falls to. Its outcome is `floor`, never judged.
    speculative: bool = True
    # with [cycle] reload = "push" or "weight_transfer": the models this variant's push or sync reaches (default: the
    # cycle's push_to)
    push_to: list[PushTarget] | None = None
    # A perturbed push or sync: checkpoint tensor name (or glob) → factor, in every model pushed or synced that is sent
    # it; `draft:NAME` or `target:NAME` limits an entry to one model. Scaling the target's tensors must change the
    # output; scaling the drafter's alone must not (the target verifies every token), and leaves a drafter unlike fresh.
    push_scale: dict[str, float] = Field(default_factory=dict)
    # A partial push or sync: checkpoint tensor names (or globs) left out, with the same `draft:` / `target:` prefixes.
    push_skip: list[str] = Field(default_factory=list)
    # A misrouted push or sync, planted on purpose to prove it is caught (weight_updates.PUSH_FAULTS): "draft-to-target"
    # (the drafter's update sent to the target), "empty-draft" (the drafter's update sends no tensors),
    # "target-also-to-draft" (the target's update written into the drafter as well).
    push_fault: PushFault | None = None
    # This variant's [cycle] discard_rules: "0.33" or "0.34" (default: the cycle's)
    discard_rules: DiscardRules | None = None
    # This variant's server.model_runner: "v1" or "v2" (default: the server's)
    model_runner: ModelRunner | None = None

    _args_list = field_validator("args", mode="before")(args_is_list)
    _args_free = field_validator("args")(no_reserved_flags)
    _env = field_validator("env", mode="before")(env_values_are_strings)
    _push_to = field_validator("push_to")(_distinct)
    _push_scale = field_validator("push_scale")(_entries)
    _push_skip = field_validator("push_skip")(_entries)


class ScenarioFile(_Strict):
    """The TOML document as written (paths still relative to the file)."""

    name: str | None = None
    description: str = ""
    # The CPU scenario of the same drafter family (a path from this file's folder): what a scenario that needs GPUs
    # names on a machine without them.
    cpu_scenario: str | None = None
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
            if key == "graph_safe":
                if not isinstance(value, bool):
                    raise ValueError("expect.graph_safe: must be true or false")
                if not value and not self.server.eager:
                    raise ValueError(
                        "expect.graph_safe: false is only for a scenario that never captures CUDA graphs"
                        " (server.enforce_eager = true): with graphs, a tensor the reload moves is read at its old"
                        " address"
                    )
                continue
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
                hint = did_you_mean(key, [*names, *EXPECT_NUMBERS, "graph_safe"])
                raise ValueError(f"expect.{key}: no variant named {key!r}{hint}")
            try:
                ByRelease.parse(value).map(expectation_text)
            except ValueError as exc:
                raise ValueError(f"expect.{key}: {exc}") from None
        return self

    @field_validator("variants")
    @classmethod
    def _patches_by_release(cls, value: dict[str, VariantSection]) -> dict[str, VariantSection]:
        for name, section in value.items():
            if isinstance(section.patch, dict):
                try:
                    ByRelease[str].parse(section.patch)
                except ValueError as exc:
                    raise ValueError(f"variants.{name}.patch: {exc}") from None
        return value

    @model_validator(mode="after")
    def _every_engine_measured(self) -> ScenarioFile:
        engines = self.server.data_parallel_size
        if self.workload.repeats < engines:
            raise ValueError(
                f"workload.repeats: {self.workload.repeats} measured requests cannot reach each of the"
                f" {engines} engines (server.data_parallel_size); every engine is judged on its own requests"
            )
        return self

    @model_validator(mode="after")
    def _keys_of_the_reload_kind(self) -> ScenarioFile:
        """Flags specwake sets for the kind are not the scenario's to set; keys of another kind are errors."""
        kind = self.cycle.reload_kind
        places = [("server.args", self.server.args)]
        places += [(f"variants.{name}.args", v.args) for name, v in self.variants.items()]
        for flag, _ in kind.server_flags:
            for key, args in places:
                if any(arg.split("=", 1)[0] == flag for arg in args):
                    raise ValueError(f'{key}: {flag} is set by specwake with cycle.reload = "{kind.name}"')
        takes = " or ".join(f'"{k.name}"' for k in RELOAD_KINDS.values() if k.keys)
        if "push_to" not in kind.keys and "push_to" in self.cycle.model_fields_set:
            raise ValueError(f"cycle.push_to: only with cycle.reload = {takes}")
        for name, section in self.variants.items():
            for key in _KIND_KEYS:
                if key not in kind.keys and key in section.model_fields_set:
                    raise ValueError(f"variants.{name}.{key}: only with cycle.reload = {takes}")
        if not kind.pushes:
            return self
        for name, section in self.variants.items():
            to = section.push_to or self.cycle.push_to
            if section.push_fault is not None:
                needs: PushTarget = "target" if section.push_fault == TARGET_ALSO_TO_DRAFT else "draft"
                if needs not in to:
                    raise ValueError(
                        f"variants.{name}.push_fault: {section.push_fault!r} misroutes the {needs} model's update,"
                        f" which this variant never {kind.sends} (push_to = {to})"
                    )
                if not section.speculative or self.speculative.get("method") in NO_DRAFT_MODEL:
                    raise ValueError(f"variants.{name}.push_fault: needs a drafter model")
            if "draft" in to:
                if not section.speculative:
                    raise ValueError(f"variants.{name}.push_to: 'draft' needs a drafter (speculative = false)")
                if self.speculative.get("method") in NO_DRAFT_MODEL:
                    method = self.speculative["method"]
                    raise ValueError(f"variants.{name}.push_to: 'draft' needs a drafter model ({method} has none)")
            _entries_reach(name, section, section.push_to or self.cycle.push_to, kind)
        return self


# Every variant key some reload kind takes, in the order they are written: in a scenario whose kind does not take it,
# an error.
_KIND_KEYS = tuple(k for k in VariantSection.model_fields if any(k in kind.keys for kind in RELOAD_KINDS.values()))


def _entries_reach(name: str, section: VariantSection, to: list[PushTarget], kind: ReloadKind) -> None:
    """A `draft:` or `target:` entry must name a model the variant pushes or syncs."""
    for key, entries in (("push_scale", list(section.push_scale)), ("push_skip", section.push_skip)):
        for entry in entries:
            role, _ = split_entry(entry)
            if role is not None and role not in to:
                raise ValueError(
                    f"variants.{name}.{key}: {entry!r} is for the {role} model, which this variant never {kind.sends}"
                    f" (push_to = {to})"
                )


# Keys users reach for that are spelled otherwise here (a misspelling is found by difflib; these are other words).
ALIASES = {
    "cycles": "count",
    "num_cycles": "count",
    "cycle_count": "count",
    "levels": "level",
    "timeout_s": "step_timeout_s",
    "k": "num_speculative_tokens",
    "num_draft_tokens": "num_speculative_tokens",
    "tp": "tensor_parallel_size",
    "dp": "data_parallel_size",
    "ep": "enable_expert_parallel",
}


def did_you_mean(word: str, choices: list[str]) -> str:
    alias = ALIASES.get(word)
    close = [alias] if alias in choices else difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def allowed_keys(parent: list[str]) -> list[str]:
    model: type[BaseModel] = ScenarioFile
    sections: dict[str, type[BaseModel]] = {"server": ServerSection, "workload": WorkloadSection, "cycle": CycleSection}
    if parent and parent[0] in sections:
        model = sections[parent[0]]
    elif parent and parent[0] == "variants":
        model = VariantSection
    return list(model.model_fields)
