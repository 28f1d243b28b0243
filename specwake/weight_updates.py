"""How the weights come back after an L2 wake, shared by specwake and its worker extension like specwake.protocol, on
which it builds: a scenario's `[cycle] reload` (vLLM's reload_weights, specwake's push, or vLLM's weight-transfer API
as RL frameworks call it), which tensors a push or sync sends and scales (`choose`), and the typed requests and answers
of a push. Imports nothing from specwake but specwake.protocol.

To add a way of bringing the weights back after the wake, add one row to RELOAD_KINDS and its steps to
specwake.run.measure.cycle's RESTORE_STEPS: the scenario format, its key checks, the server's flags, whether the
drafter is judged, `check` and the report's words follow from the row.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from specwake.protocol import RELOAD, ROLES, TRANSFER_BACKEND, known_fields

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
        return cls(**known_fields(cls, data))


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
