"""The sleep/wake protocol between specwake and its worker extension, in one place and shared by both sides (the CLI
process and vLLM's workers): the worker methods specwake calls, one table of cycle steps, and the typed requests and
answers that travel through POST /collective_rpc. Imports nothing from specwake.

To add a cycle step, add one row to STEPS: the cycle (specwake.run.measure.cycle), the probe points
(specwake.run.measure.diagnose), what counts as a restore (specwake.judge.weights) and as the wake (the `max_wake_s`
limit, the report's ledger) follow from it. How the weights come back after the wake (reload, push, sync) is
specwake.weight_updates, built on this module.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
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


def known_fields(cls: type, data: Any) -> dict[str, Any]:
    """The keys of `data` that are fields of `cls` (answers of older or newer specwakes read alike)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names} if isinstance(data, dict) else {}


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
        return cls(**known_fields(cls, data))


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
        known = known_fields(cls, data)
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
        known = known_fields(cls, data)
        return cls(**({"device": "?"} | known))
