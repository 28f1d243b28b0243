"""The sleep/wake protocol between specwake and its worker extension, in one place and shared by both sides (the CLI
process and vLLM's workers): the worker methods specwake calls, one table of cycle steps, and the typed requests and
answers that travel through POST /collective_rpc. Imports nothing from specwake.

To add a cycle step, add one row to STEPS: the cycle (specwake.run.measure.cycle), the probe points
(specwake.run.measure.diagnose), what counts as a restore (specwake.judge.weights) and as the wake (the `max_wake_s`
limit, the report's ledger) follow from it. To add a way of bringing the weights back after the wake, add one row to
RELOAD_KINDS and its steps to specwake.run.measure.cycle's RESTORE_STEPS: the scenario format, its key checks, the
server's flags, whether the drafter is judged, `check` and the report's words follow from the row.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any

# -- worker methods (specwake.worker.extension), and vLLM's own reload ------------------------------------------------
INFO = "specwake_info"
FINGERPRINT = "specwake_fingerprint"
MEMORY = "specwake_memory"
DISCARD = "specwake_emulate_discard"
PUSH = "specwake_push"
TRANSFER_MANIFEST = "specwake_transfer_manifest"
RELOAD = "reload_weights"
# every method specwake calls through /collective_rpc: its extension's own, and vLLM's Worker.reload_weights (`make
# releases` holds the last to each release's Worker)
WORKER_METHODS = (INFO, FINGERPRINT, MEMORY, DISCARD, PUSH, TRANSFER_MANIFEST, RELOAD)
FRESH = "fresh"  # the name the workers keep the fresh fingerprints under
RESTORED = "restored"  # the name they keep each cycle's fingerprints right after its reload, push or sync under
UPDATING = "updating"  # the name they keep the fingerprints taken before each model's push or sync session under
ROLES = ("target", "draft")
KINDS = ("parameter", "buffer", "attribute")  # every tensor a model holds, by what an L2 sleep does with it

# -- vLLM's weight-transfer API (vllm/entrypoints/rl/online/api_router.py, mounted with VLLM_SERVER_DEV_MODE=1) --------
TRANSFER_BACKEND = "specwake_file"  # specwake's transport engine (specwake.worker.transfer), registered in the workers
SLEEP_METRIC = "vllm:sleep_mode_operation_duration_seconds"  # histograms vLLM's API server keeps per `operation`
TRANSFER_METRIC = "vllm:rl_weight_update_operation_duration_seconds"

# -- the SpeculativeConfig fields that decide what AL measures (vllm/config/speculative.py, 0.32+), read by the
# validation in the variant's vLLM (specwake.worker.validate) and judged before launch (specwake.prepare.speculation)
METHOD_FIELD = "rejection_sample_method"  # how drafts are verified: "standard", "synthetic", "block", "fly" (0.33+)
ADAPTIVE_FIELD = "enable_adaptive_verification"  # vLLM sizes each step's verification budget itself
K_FIELD = "num_speculative_tokens"
SCHEDULE_FIELD = "num_speculative_tokens_per_batch_size"  # [(first batch size, last, K), ...]


# -- cycle steps -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepKind:
    """One kind of cycle step: its call, and what may be read or judged after it."""

    name: str
    method: str  # HTTP method
    path: str
    rpc: str | None = None  # worker method, for POST /collective_rpc
    wakes: bool = False  # part of the wake: its seconds count towards the cycle's wake time
    restores: bool = False  # weights must be back as fresh after it: target (and drafter) are judged there
    fingerprints: bool = False  # weights are resident after it: fingerprints may be read (never mid-sleep)
    memory: bool = False  # device memory is read after it
    # vLLM's own timing of this call: (histogram, `operation` label), where the server keeps one
    vllm_metric: tuple[str, str] | None = None

    @property
    def point(self) -> str:
        """The probe point right after this step, e.g. `after reload_weights`."""
        return f"after {self.name}"


SLEEP = StepKind("sleep", "POST", "/sleep", memory=True, vllm_metric=(SLEEP_METRIC, "sleep"))
DISCARD_STEP = StepKind("discard", "POST", "/collective_rpc", rpc=DISCARD, fingerprints=True)
WAKE_WEIGHTS = StepKind("wake_weights", "POST", "/wake_up", wakes=True, memory=True,
                        vllm_metric=(SLEEP_METRIC, "wake"))  # fmt: skip
RELOAD_STEP = StepKind(RELOAD, "POST", "/collective_rpc", rpc=RELOAD, wakes=True, restores=True, fingerprints=True,
                       memory=True)  # fmt: skip
PUSH_STEP = StepKind("push", "POST", "/collective_rpc", rpc=PUSH, wakes=True, restores=True, fingerprints=True,
                     memory=True)  # fmt: skip
# A weight sync through vLLM's weight-transfer API: the engine initialized once per server, then one session per model
# (target, then drafter), each start → update_weights per chunk → finish. The weights are judged at SYNC_POINT, after
# the last session's finish: so a drafter session that writes into the target is caught too.
INIT_TRANSFER = StepKind("init_weight_transfer_engine", "POST", "/init_weight_transfer_engine",
                         vllm_metric=(TRANSFER_METRIC, "init"))  # fmt: skip
START_UPDATE = StepKind("start_weight_update", "POST", "/start_weight_update", wakes=True,
                        vllm_metric=(TRANSFER_METRIC, "start"))  # fmt: skip
START_DRAFT_UPDATE = StepKind("start_draft_weight_update", "POST", "/start_draft_weight_update", wakes=True,
                              vllm_metric=(TRANSFER_METRIC, "start_draft"))  # fmt: skip
UPDATE_WEIGHTS = StepKind("update_weights", "POST", "/update_weights", wakes=True,
                          vllm_metric=(TRANSFER_METRIC, "update"))  # fmt: skip
FINISH_UPDATE = StepKind("finish_weight_update", "POST", "/finish_weight_update", wakes=True,
                         vllm_metric=(TRANSFER_METRIC, "finish"))  # fmt: skip
WAKE_KV_CACHE = StepKind("wake_kv_cache", "POST", "/wake_up", wakes=True, memory=True,
                         vllm_metric=(SLEEP_METRIC, "wake"))  # fmt: skip
WAKE_UP = StepKind("wake_up", "POST", "/wake_up", wakes=True,
                   vllm_metric=(SLEEP_METRIC, "wake"))  # level 1: everything at once  # fmt: skip
RESET_PREFIX_CACHE = StepKind("reset_prefix_cache", "POST", "/reset_prefix_cache")

STEPS = (
    SLEEP, DISCARD_STEP, WAKE_WEIGHTS, RELOAD_STEP, PUSH_STEP,
    INIT_TRANSFER, START_UPDATE, START_DRAFT_UPDATE, UPDATE_WEIGHTS, FINISH_UPDATE,
    WAKE_KV_CACHE, WAKE_UP, RESET_PREFIX_CACHE,
)  # fmt: skip
STEP_BY_NAME = {step.name: step for step in STEPS}

FRESH_POINT = "after fresh"  # after the fresh stage: the fingerprints kept to compare with
BEFORE_SLEEP = "before sleep"
SYNC_POINT = "after weight sync"  # after the last session of a sync: weights are judged there, like after a reload
# Around each model's update of a push or sync (one push or one session per model): both models fingerprinted before
# the first (BEFORE_UPDATE, after wake_weights) and after each, compared with the readings before it, so an update that
# changes the model it does not address, or none of the one it does, is caught and named (specwake.judge.weights).
# After the last update the point is the cycle's restore point (after push, SYNC_POINT); UPDATE_POINT after the others.
BEFORE_UPDATE = "before update"
UPDATE_POINT = "after update"
# After each measured stage that follows a cycle: compared with fresh and with the cycle's RESTORED fingerprints, so a
# tensor the stage's own forwards changed is caught (the last one is the end of the run: nothing runs after it)
STAGE_POINT = "after stage"
FINGERPRINT_POINTS = frozenset(
    {FRESH_POINT, SYNC_POINT, STAGE_POINT, BEFORE_UPDATE, UPDATE_POINT, *(s.point for s in STEPS if s.fingerprints)}
)
MEMORY_POINTS = frozenset({BEFORE_SLEEP, SYNC_POINT, *(s.point for s in STEPS if s.memory)})
RESTORE_POINTS = (*(s.point for s in STEPS if s.restores), SYNC_POINT)
WAKE_STEPS = tuple(s.name for s in STEPS if s.wakes)
AWAKE_POINT = WAKE_KV_CACHE.point  # the last point of an L2 wake where memory is read


# -- requests and answers ----------------------------------------------------------------------------------------------


def _known(cls: type, data: Any) -> dict[str, Any]:
    """The keys of `data` that are fields of `cls` (answers of older or newer specwakes read alike)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names} if isinstance(data, dict) else {}


# -- how the weights come back after the wake: a scenario's [cycle] reload ---------------------------------------------

PUSH_VIA = "push"  # specwake's worker extension loads the tensors (specwake_push)
SYNC_VIA = "weight_transfer"  # vLLM's weight-transfer API, one session per model
TRANSFER_FLAG = "--weight-transfer-config"
PUSH_KEYS = ("push_to", "push_scale", "push_skip", "push_fault")  # the scenario keys of a push or sync
PUSH_ORDER = ("draft", "target")  # a push's models in order: modules they share end up with the target's tensors
SYNC_ORDER = ("target", "draft")  # a sync's sessions in order, as RL frameworks run them
# A misrouted update, planted on purpose (a variant's push_fault) so a test can prove it is caught and named: the
# drafter's update sent to the target (verl-SpeCo#78), a drafter's update that sends no tensors, the target's update
# written into the drafter as well.
DRAFT_TO_TARGET = "draft-to-target"
EMPTY_DRAFT = "empty-draft"
TARGET_ALSO_TO_DRAFT = "target-also-to-draft"
PUSH_FAULTS = (DRAFT_TO_TARGET, EMPTY_DRAFT, TARGET_ALSO_TO_DRAFT)


@dataclass(frozen=True)
class ReloadKind:
    """One way a cycle brings the weights back after the wake (the value of [cycle] reload). `via` is how pushed
    tensors travel (PushRequest.via), None where vLLM reloads them from the checkpoint itself; `keys` the scenario
    keys only this kind takes ([cycle] push_to, and the variants' push_to, push_scale, push_skip); `server_flags`
    what specwake adds to the server's command for it, a flag the scenario must then not set. The drafter is judged
    after every cycle when the kind reloads it from its checkpoint (`via` None); after a push or sync, only where the
    drafter is sent (specwake.judge.verdict.judges_drafter). The words: `noun` names one in explanations ("the sync
    scaled …"), `sends` is the verb of a scenario error, `check_verb` starts `check`'s line of what a variant sends,
    `restored_by` ends the report's note on the emulated discard ({pushed}: the models each variant sent), `did`
    the report's heading line of a variant ({to}: the models it sent), `update` one model's update ("the draft
    session"), `order` the order the models are updated in."""

    name: str
    via: str | None
    noun: str
    sends: str
    restored_by: str
    check_verb: str | None = None
    did: str = ""
    keys: tuple[str, ...] = ()
    server_flags: tuple[tuple[str, str], ...] = ()
    update: str = "{role} update"
    order: tuple[str, ...] = PUSH_ORDER

    @property
    def pushes(self) -> bool:
        return self.via is not None

    @property
    def syncs(self) -> bool:
        return self.via == SYNC_VIA


RELOAD_KIND = ReloadKind(
    RELOAD, None, "reload", "reloads", "wake and reload_weights are unmodified vLLM",
)  # fmt: skip
PUSH_KIND = ReloadKind(
    PUSH_VIA, PUSH_VIA, "push", "pushes",
    "wake is unmodified vLLM; the weights came back by specwake's push ({pushed})",
    check_verb="pushes to", did="pushed {to}", keys=PUSH_KEYS, update="{role} push",
)  # fmt: skip
SYNC_KIND = ReloadKind(
    SYNC_VIA, SYNC_VIA, "sync", "syncs",
    "wake and the weight-transfer sessions are unmodified vLLM, with specwake's file transport ({pushed})",
    check_verb="syncs through vLLM's weight-transfer API:", did="synced {to} through vLLM's weight-transfer API",
    keys=PUSH_KEYS, update="{role} session", order=SYNC_ORDER,
    # the engine the workers create at load; specwake's worker extension registers it
    server_flags=((TRANSFER_FLAG, json.dumps({"backend": TRANSFER_BACKEND}, separators=(",", ":"))),),
)  # fmt: skip
RELOAD_KINDS = {kind.name: kind for kind in (RELOAD_KIND, PUSH_KIND, SYNC_KIND)}
KIND_BY_VIA = {kind.via: kind for kind in RELOAD_KINDS.values()}  # None → reload_weights


def split_entry(entry: str) -> tuple[str | None, str]:
    """A push_scale or push_skip entry → (the model it is limited to, or None for every model; its name or glob
    pattern): `draft:model.norm.weight` → ("draft", "model.norm.weight")."""
    role, sep, pattern = entry.partition(":")
    return (role, pattern) if sep and role in ROLES else (None, entry)


def entry_matches(entry: str, role: str, name: str) -> bool:
    """Whether an entry picks tensor `name` of `role`'s push or sync (a glob: `*`, `?`, `[…]`; case counts)."""
    limited, pattern = split_entry(entry)
    return limited in (None, role) and fnmatch.fnmatchcase(name, pattern)


@dataclass(frozen=True)
class Chosen:
    """What a push or sync does to one model's checkpoint tensors on the way: the names it leaves out, and the
    factor of each name it scales (names as vLLM's loader gives them to the model)."""

    skip: tuple[str, ...] = ()
    scale: dict[str, float] = field(default_factory=dict)

    @cached_property
    def left_out(self) -> frozenset[str]:
        return frozenset(self.skip)

    def to_dict(self) -> dict[str, Any]:
        return {"skip": list(self.skip), "scale": dict(self.scale)}

    @classmethod
    def from_dict(cls, data: Any) -> Chosen:
        data = data if isinstance(data, dict) else {}
        return cls(tuple(data.get("skip") or ()), {str(k): float(v) for k, v in (data.get("scale") or {}).items()})


def choose(
    names: Mapping[str, Sequence[str]], scale: Mapping[str, float], skip: Iterable[str]
) -> tuple[dict[str, Chosen], list[str]]:
    """Each model's `Chosen`, from the checkpoint names its push or sync sends (`names`, by role) and the variant's
    push_scale and push_skip entries; and the entries that picked no tensor sent (a scale entry picking only names
    left out included). A name several scale entries pick is scaled by each."""
    skip = tuple(skip)
    picked: set[str] = set()
    chosen = {}
    for role, sent in names.items():
        left_out: list[str] = []
        factors: dict[str, float] = {}
        for name in sent:
            skips = [e for e in skip if entry_matches(e, role, name)]
            if skips:
                picked.update(skips)
                left_out.append(name)
                continue
            for entry, factor in scale.items():
                if entry_matches(entry, role, name):
                    picked.add(entry)
                    factors[name] = factors.get(name, 1.0) * factor
        chosen[role] = Chosen(tuple(left_out), factors)
    unmatched = [e for e in (*scale, *skip) if e not in picked]
    return chosen, unmatched


@dataclass(frozen=True)
class PushRequest:
    """New weights after the wake, as RL trainers send them: which models get their checkpoint's tensors, the
    variant's push_scale (entry → factor) and push_skip entries, and how they travel (`via`: specwake's push, or
    vLLM's weight-transfer API). `chosen`: what those entries pick of each model's tensors, once resolved against
    the names the server's loader reads (specwake.run.session.variant_run does, before the first cycle)."""

    to: tuple[str, ...] = ("target",)
    scale: dict[str, float] = field(default_factory=dict)
    via: str = PUSH_VIA
    skip: tuple[str, ...] = ()
    chosen: dict[str, Chosen] = field(default_factory=dict)
    fault: str | None = None  # a misrouted update planted on purpose (PUSH_FAULTS): the variant's push_fault

    @property
    def changes(self) -> bool:
        """Whether it scales or leaves out anything: a perturbed or partial push or sync."""
        return bool(self.scale or self.skip)

    def to_json(self) -> str:
        """As /collective_rpc carries it (a string argument)."""
        data: dict[str, Any] = {"to": list(self.to), "scale": dict(self.scale)}
        if self.skip:
            data["skip"] = list(self.skip)
        if self.chosen:
            data["chosen"] = {role: c.to_dict() for role, c in self.chosen.items()}
        if self.fault:
            data["fault"] = self.fault
        return json.dumps(data, sort_keys=True)

    @property
    def syncs(self) -> bool:
        return self.via == SYNC_VIA

    @classmethod
    def from_dict(cls, data: Any) -> PushRequest:
        data = data if isinstance(data, dict) else {}
        to, scale = tuple(data.get("to") or ("target",)), dict(data.get("scale") or {})
        chosen = {str(role): Chosen.from_dict(c) for role, c in (data.get("chosen") or {}).items()}
        fault = str(data["fault"]) if data.get("fault") else None
        return cls(to, scale, str(data.get("via") or PUSH_VIA), tuple(data.get("skip") or ()), chosen, fault)

    @classmethod
    def from_json(cls, text: str) -> PushRequest:
        return cls.from_dict(json.loads(text or "{}"))


@dataclass(frozen=True)
class PushAnswer:
    """What each worker pushed, the names it scaled and left out, and the chosen names no pushed tensor had."""

    pushed: dict[str, str] = field(default_factory=dict)
    scaled: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any) -> PushAnswer:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class TransferChunk:
    """One /update_weights call of a sync: checkpoint tensors of one model, read by name from one safetensors file
    of its checkpoint (specwake's transport; see specwake.worker.transfer)."""

    role: str  # "target" | "draft": the session it belongs to
    file: str
    names: tuple[str, ...]
    prefix: str = ""  # put before each name, as vLLM's loader does for a model's `secondary_weights`
    scale: tuple[tuple[str, float], ...] = ()  # names of the chunk (as in the file) to scale, and by what

    @property
    def loaded_names(self) -> list[str]:
        """The names as the model's load_weights receives them (prefixed)."""
        return [self.prefix + n for n in self.names]

    def narrowed(self, chosen: Chosen) -> TransferChunk | None:
        """The chunk as a perturbed or partial sync sends it: names left out, factors attached (None: nothing left)."""
        names = tuple(n for n in self.names if self.prefix + n not in chosen.left_out)
        scale = tuple((n, chosen.scale[self.prefix + n]) for n in names if self.prefix + n in chosen.scale)
        return TransferChunk(self.role, self.file, names, self.prefix, scale) if names else None

    def update_info(self) -> dict[str, Any]:
        """The body's `update_info`, as the engine parses it (`prefix` and `scale` only where there are some)."""
        info: dict[str, Any] = {"file": self.file, "names": list(self.names)}
        info |= {"prefix": self.prefix} if self.prefix else {}
        return info | ({"scale": dict(self.scale)} if self.scale else {})

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role} | self.update_info()

    @classmethod
    def from_dict(cls, data: Any) -> TransferChunk:
        scale = tuple((str(k), float(v)) for k, v in (data.get("scale") or {}).items())
        return cls(str(data["role"]), str(data["file"]), tuple(data["names"]), str(data.get("prefix", "")), scale)


# -- the emulated Level-2 discard (specwake.worker.discard) ------------------------------------------------------------

# Whose Level-2 sleep the emulated discard follows: "0.33" (vLLM 0.32 and 0.33: the weights pool dropped, buffers and
# preserved parameters saved by name and written back) or "0.34" (only the allocations that hold nothing but
# parameters the update rewrites are dropped; everything else is backed up to host memory). A scenario's
# `discard_rules`; None: the rules of the vLLM the worker runs (release_rules).
DISCARD_RULES = ("0.33", "0.34")
# How docs and output name each: by the releases whose L2 sleep it follows (a bare "0.33" reads as 0.33 alone).
RULES_NAMES = {"0.33": "0.32/0.33 rules", "0.34": "0.34 rules"}


def rules_name(rules: str) -> str:
    """`0.32/0.33 rules` for "0.33", `0.34 rules` for "0.34": the one wording of check, reports and docs."""
    return RULES_NAMES.get(rules, f"{rules} rules")


def release_rules(version: str) -> str:
    """The discard rules of a vLLM version: "0.34" from 0.34.0 on (its pre-releases and dev builds included), else
    "0.33" (`0.32.0`, `0.33.1.dev12+g0123abcd`; a version that names no release reads as the older rules)."""
    found = re.match(r"\s*v?(\d+)\.(\d+)", version)
    release = (int(found[1]), int(found[2])) if found is not None else (0, 0)
    return "0.34" if release >= (0, 34) else "0.33"


@dataclass(frozen=True)
class Discarded:
    """What an emulated discard did to one model, by kind: the tensors whose memory it overwrote (`parameter`,
    `attribute`, `buffer`), the packed CPU weights it made answer as discarded (`packed`), and those it left as they
    were (`*_kept`: what vLLM keeps or writes back across the sleep under the rules applied)."""

    parameter: int = 0
    attribute: int = 0
    packed: int = 0
    buffer: int = 0
    parameter_kept: int = 0
    attribute_kept: int = 0
    packed_kept: int = 0
    buffer_kept: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> Discarded:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class DiscardAnswer:
    """One worker's answer to the emulated discard: the rules it followed (DISCARD_RULES; "" in an older specwake's
    answer) and the `--sleep-preserve-parameter-names` patterns it honoured."""

    fill: str
    filled_elements: int
    draft_present: bool
    models: dict[str, Discarded]  # role → what it lost (roles without a model are absent)
    rules: str = ""
    preserve: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"fill": self.fill, "filled_elements": self.filled_elements}
        answer |= {"draft_present": self.draft_present, "rules": self.rules, "preserve": list(self.preserve)}
        return answer | {role: asdict(counts) for role, counts in self.models.items()}

    @classmethod
    def from_dict(cls, data: Any) -> DiscardAnswer | None:
        """None for an answer that counts nothing by model (an older specwake's)."""
        if not isinstance(data, dict) or not any(isinstance(data.get(role), dict) for role in ROLES):
            return None
        models = {role: Discarded.from_dict(data[role]) for role in ROLES if isinstance(data.get(role), dict)}
        elements, draft = int(data.get("filled_elements") or 0), bool(data.get("draft_present"))
        rules, preserve = str(data.get("rules") or ""), tuple(str(p) for p in data.get("preserve") or ())
        return cls(str(data.get("fill")), elements, draft, models, rules, preserve)


# How a tensor that differs from fresh differs (Fingerprint.differ_how), as the worker reads it (specwake.worker.digest)
REARRANGED = "rearranged"  # the same values in other places: rows reversed, halves swapped, another order
SIGNS = "signs"  # the same magnitudes, some signs changed
VALUES = "values"  # other values
GONE = "gone"  # resident when fresh, now on meta or emptied
DIFFERENCES = (REARRANGED, SIGNS, VALUES, GONE)
# What a fingerprint compares: 1, the sum of |x| per tensor within a relative 1e-9 (an older specwake's: blind to a
# permutation or a sign change); 2, a position-weighted digest of each tensor's bits, exactly, with sums that say how
# a tensor differs (specwake.worker.digest), but tensors re-derived after loading on an accelerator by their sums
# within 1e-9 (`by_sums`: blind to order); 3, every tensor by its digest, but those named inexact by their projection
# within rounding, which sees order (`inexact`). An answer without `version` is a version 1 answer.
FINGERPRINT_VERSION = 3


@dataclass(frozen=True)
class Fingerprint:
    """One model's fingerprint on one rank (see specwake.worker.tensors). The counts from `tensors` to `nonfinite`
    are over parameters; `kinds` counts every judged tensor; the comparison fields are None at `after fresh`, where
    the fingerprint is kept instead, and in results of a specwake that compared nothing. `differ_names`: the first
    differing tensors (20; 5 before version 2), `differ_how` the kind of difference of each (DIFFERENCES),
    `differ_by_how` the counts of every kind; `inexact`: tensors compared by their projection within rounding, not bit
    for bit (named inexact: specwake.worker.tensors.INEXACT, the scenario's cycle.inexact_tensors); `by_sums` (version
    2 only): tensors compared by their sums within a tolerance (re-derived after loading on an accelerator)."""

    version: int = 1
    present: bool = True
    model_class: str | None = None  # "class" in JSON
    tensors: int = 0
    numel: int = 0
    all_zero: int = 0
    on_meta: int = 0
    empty: int = 0
    shared_with_target: int = 0
    nonfinite: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    unread: int = 0
    host_side: int = 0
    packed: int = 0
    packed_discarded: int = 0
    unpacked: int = 0  # packed CPU copies read back and compared in place of (or beside) their parameter's values
    abs_sum: float = 0.0
    compared: int | None = None
    differ: int | None = None
    differ_names: list[str] = field(default_factory=list)
    differ_by_kind: dict[str, int] = field(default_factory=dict)
    differ_how: dict[str, str] = field(default_factory=dict)
    differ_by_how: dict[str, int] = field(default_factory=dict)
    inexact: int = 0
    by_sums: int = 0
    moved: int | None = None
    moved_names: list[str] = field(default_factory=list)
    moved_by_kind: dict[str, int] = field(default_factory=dict)
    # Parameters no load writes (specwake.worker.coverage), found at `after fresh`: never counted in `differ`, so
    # their checksums decide nothing. `coverage_error`: why that could not be found (then every parameter is judged).
    uncovered: int = 0
    uncovered_names: list[str] = field(default_factory=list)
    coverage_error: str | None = None
    uncovered_differ: int | None = None  # those of them that differ from fresh (compared like the others)
    uncovered_differ_names: list[str] = field(default_factory=list)
    # At STAGE_POINT: the tensors that differ from the cycle's RESTORED fingerprints (changed during the stage; every
    # tensor compared alike, uncovered ones included), the first 20 with how; after each model's push or sync session
    # (UPDATE_POINT, and the restore point that ends a push or sync): those that differ from the readings before that
    # update (UPDATING); None where nothing was compared so
    changed: int | None = None
    changed_names: list[str] = field(default_factory=list)
    changed_how: dict[str, str] = field(default_factory=dict)
    changed_shared: list[str] = field(default_factory=list)  # the changed tensors a drafter shares with the target

    @property
    def changed_own(self) -> int:
        """Changed tensors that are this model's own: a drafter's shared with the target are the target's to judge."""
        return (self.changed or 0) - len(self.changed_shared)

    @property
    def compares(self) -> bool:
        return self.differ is not None

    @property
    def not_restored(self) -> int:
        """Tensors not back as fresh: differing, on meta, or a packed copy still discarded (0 when not compared)."""
        return (self.differ or 0) + self.on_meta + self.packed_discarded if self.compares else 0

    def to_dict(self) -> dict[str, Any]:
        if not self.present:
            return {"present": False}
        data = asdict(self)
        data["class"] = data.pop("model_class")
        if self.version >= 3:
            data.pop("by_sums")  # version 2's way, never used since
        if not self.compares:
            for key in ("compared", "differ", "differ_names", "differ_by_kind", "differ_how", "differ_by_how"):
                data.pop(key)
            for key in ("inexact", "by_sums", "moved", "moved_names"):
                data.pop(key, None)
            data.pop("moved_by_kind")
            data.pop("uncovered_differ")
            data.pop("uncovered_differ_names")
        if self.changed is None:
            for key in ("changed", "changed_names", "changed_how", "changed_shared"):
                data.pop(key)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Fingerprint | None:
        """None when `data` is not a fingerprint at all; `present` False for a model the worker did not have."""
        if not isinstance(data, dict):
            return None
        known = _known(cls, data)
        known.pop("model_class", None)
        return cls(model_class=data.get("class"), **known)


@dataclass(frozen=True)
class Memory:
    """Free and total accelerator memory of one rank in bytes; None on CPU (no device memory to report)."""

    device: str
    free_bytes: int | None = None
    total_bytes: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Memory:
        known = _known(cls, data)
        return cls(**({"device": "?"} | known))
