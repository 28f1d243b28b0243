"""The tensor names of a scenario's checkpoints, per model, read from their safetensors headers on this machine (a local
folder or the Hugging Face cache; never a download): what push_scale and push_skip may name. Before anything starts
an entry that names none is refused (exit 2, file and key), and `check --tensors` lists them.

Only the headers are read (an 8-byte length, then JSON), so the CLI needs neither torch nor vLLM for it. The names are
the checkpoint's; a push or sync sends each model the names vLLM's loader reads of them (for a drafter inside the
target's checkpoint, MTP, the target's whole checkpoint), and the run resolves the entries against those.
"""

from __future__ import annotations

import fnmatch
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwake.errors import ScenarioError
from specwake.events import Event, Events
from specwake.prepare.hub import cached_snapshot
from specwake.prepare.scenario import Scenario, Variant
from specwake.prepare.scenario_file import NO_DRAFT_MODEL
from specwake.weight_updates import split_entry

MAX_HEADER = 512 * 1024 * 1024  # a safetensors header longer than this is no header
WORDS = {"target": "target", "draft": "drafter"}


def safetensors_header(file: Path) -> dict[str, Any]:
    """A safetensors file's header: each tensor's name → its dtype, shape and data_offsets, in the file's order (its
    `__metadata__` left out); ValueError when it is no safetensors file."""
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise ValueError(f"{file}: too short for a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_HEADER:
            raise ValueError(f"{file}: not a safetensors header ({size} bytes)")
        try:
            header = json.loads(handle.read(size))
        except (UnicodeDecodeError, ValueError):
            raise ValueError(f"{file}: its safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: its safetensors header is not a JSON object")
    return {name: entry for name, entry in header.items() if name != "__metadata__"}


def safetensors_names(file: Path) -> list[str]:
    """The tensor names in a safetensors file's header, in its order; ValueError when it is no safetensors file."""
    return list(safetensors_header(file))


@dataclass(frozen=True)
class Checkpoint:
    """One model's checkpoint as push_scale and push_skip see it: its names, or why they are unknown here."""

    role: str
    model: str  # as the server loads it
    names: tuple[str, ...] | None = None
    problem: str | None = None  # why `names` is None
    in_target: bool = False  # a drafter whose tensors are in the target's checkpoint (MTP)

    def line(self) -> str:
        """`draft: /…/tiny-llama-v1, 21 tensors`, or why its names are unknown."""
        where = "the target's checkpoint" if self.in_target else self.model
        if self.names is None:
            return f"{self.role}: {where}: {self.problem}"
        return f"{self.role}: {where}, {len(self.names)} tensors"


def _folder(model: str) -> Path | None:
    """The model's files on this machine: its folder, or its snapshot in the Hugging Face cache."""
    folder = Path(model).expanduser()
    return folder if folder.is_dir() else cached_snapshot(model)


def safetensors_files(model: str) -> list[Path] | str:
    """A model's safetensors files on this machine, sorted; or why there are none here (never a download)."""
    folder = _folder(model)
    if folder is None:
        return "not on this machine (no local folder or cached snapshot)"
    files = sorted(folder.glob("*.safetensors"))
    return files or f"no safetensors files in {folder}"


def read_checkpoint(role: str, model: str) -> Checkpoint:
    """Every tensor name of a model's safetensors files, sorted."""
    files = safetensors_files(model)
    if isinstance(files, str):
        return Checkpoint(role, model, problem=files)
    names: set[str] = set()
    try:
        for file in files:
            names.update(safetensors_names(file))
    except (OSError, ValueError) as exc:
        return Checkpoint(role, model, problem=str(exc))
    return Checkpoint(role, model, tuple(sorted(names)))


def own_draft_model(scenario: Scenario, draft_model: str | None) -> str | None:
    """The drafter's own checkpoint as the server loads it (`draft_model`: a builtin one resolved), or None where the
    scenario names none: the drafter is then in the target's checkpoint (MTP), or has no model (n-gram methods)."""
    draft = draft_model or scenario.speculative.get("model")
    return draft if isinstance(draft, str) else None


def checkpoints(scenario: Scenario, model: str, draft_model: str | None) -> dict[str, Checkpoint]:
    """The target's checkpoint and the drafter's, by role (`model`, `draft_model`: as the server gets them, builtin
    models resolved). A drafter without a model of its own is in the target's checkpoint; n-gram methods have none."""
    found = {"target": read_checkpoint("target", model)}
    if scenario.speculative.get("method") in NO_DRAFT_MODEL:
        return found
    draft = own_draft_model(scenario, draft_model)
    if draft is not None:
        found["draft"] = read_checkpoint("draft", draft)
    else:
        target = found["target"]
        found["draft"] = Checkpoint("draft", target.model, target.names, target.problem, in_target=True)
    return found


def check_entries(scenario: Scenario, variant: Variant, found: dict[str, Checkpoint], events: Events) -> None:
    """Every push_scale and push_skip entry must name a tensor of a checkpoint it applies to (its `target:` or
    `draft:` model, else any model the variant pushes or syncs): ScenarioError (exit 2) at the first that names
    none. Where a checkpoint is not on this machine the check is skipped, and said so."""
    file = str(scenario.file)
    for key, entries, what in (
        ("push_scale", [entry for entry, _ in variant.push_scale], "scaled"),
        ("push_skip", list(variant.push_skip), "left out"),
    ):
        for entry in entries:
            role, pattern = split_entry(entry)
            books = [found[r] for r in ([role] if role else variant.push_to) if r in found]
            unknown = [b for b in books if b.names is None]
            if unknown:
                events(Event(f"not checked: {key} names: {unknown[0].line()}", variant.name))
                continue
            if not any(fnmatch.fnmatchcase(name, pattern) for book in books for name in book.names or ()):
                whose = f"the {WORDS[role]}'s checkpoint" if role else "the checkpoint" + "s" * (len(books) > 1)
                reason = f"{entry!r} names no tensor of {whose}: nothing would be {what}"
                raise ScenarioError(file, f"variants.{variant.name}.{key}", reason)


def tensor_lines(found: dict[str, Checkpoint]) -> list[str]:
    """`check --tensors`: every name a push_scale or push_skip entry may use, per model, one a line."""
    lines = ["  checkpoint tensors push_scale and push_skip may name (`target:NAME` / `draft:NAME`: that model only):"]
    for book in found.values():
        lines.append(f"    {book.line()}")
        if book.in_target:
            lines.append("      (the target's names above; the drafter loads those of its own layers)")
        else:
            lines += [f"      {name}" for name in book.names or ()]
    return lines


def validate_entries(checks: Sequence[tuple[Scenario, Variant, str, str | None]], events: Events) -> None:
    """`check_entries` for every variant that perturbs or leaves out tensors (scenario, variant, model, drafter);
    each scenario's checkpoints read once."""
    read: dict[tuple[str, str, str | None], dict[str, Checkpoint]] = {}
    for scenario, variant, model, draft_model in checks:
        if variant.push_scale or variant.push_skip:
            key = (str(scenario.file), model, draft_model)
            if key not in read:
                read[key] = checkpoints(scenario, model, draft_model)
            check_entries(scenario, variant, read[key], events)
