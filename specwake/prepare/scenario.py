"""Scenario files: TOML → one strict, frozen Scenario, with command-line overrides merged in and paths resolved
(the keys themselves are defined in specwake.prepare.scenario_file).

Every problem becomes a ScenarioError that renders as one line: ``file: key.path: reason``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specwake.errors import ScenarioError
from specwake.files import what_it_is
from specwake.judge.expectations import Limits
from specwake.prepare import expected as expect
from specwake.prepare.key_errors import error_from_validation
from specwake.prepare.prompts import BUILTIN_PROMPTS
from specwake.prepare.releases import ByRelease
from specwake.prepare.scenario_file import (
    SAFE_NAME,
    CycleSection,
    ScenarioFile,
    ServerSection,
    VariantSection,
    WorkloadSection,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Variant:
    """One variant as the file wrote it. Its patch and expectation may depend on the vLLM release
    (specwake.prepare.releases.ByRelease); `patch` and `expected` answer for `release`, which preparation sets to the
    version the variant's interpreter has (`for_release`)."""

    name: str
    patches: ByRelease[Path] | None  # absolute paths
    python: str | None  # None: the interpreter running specwake
    env: dict[str, str]
    expects: ByRelease[str]
    args: tuple[str, ...] = ()
    speculative: bool = True
    level: int = 2  # the sleep level its cycles use
    push_to: tuple[str, ...] = ("target",)  # with [cycle] reload = "push"
    push_scale: tuple[tuple[str, float], ...] = ()  # a perturbed push or sync (see VariantSection)
    push_skip: tuple[str, ...] = ()  # a partial push or sync
    push_fault: str | None = None  # a misrouted push or sync planted on purpose (weight_updates.PUSH_FAULTS)
    discard_rules: str | None = None  # whose L2 sleep an emulated discard follows; None: the installed vLLM's
    model_runner: str | None = None  # "v1" | "v2": the runner its server is told to run; None: vLLM's own choice
    # where model_runner was set, as an error names it: its own table's key, the server's, or the flag
    model_runner_from: str = "server.model_runner"
    release: str | None = None  # the vLLM version `patch` and `expected` answer for; None before preparation
    patch_from_flag: bool = False  # the patch is --patch's, not the file's
    # where the expectation comes from when the file does not write it: "--expect", or "--patch default" (the
    # `patched` variant --patch added expects recover); None: the file's [expect] (or its default, `any`)
    expected_from: str | None = None

    @property
    def patch(self) -> Path | None:
        """The diff for `release`; before preparation, the one diff when it does not depend on the release (else
        None: see `patches`)."""
        if self.patches is None:
            return None
        return self.patches.for_release(self.release) if self.release or not self.patches.varies else None

    @property
    def expected(self) -> str:
        """The expectation for `release`; before preparation, one per release written out ("collapse on <0.34,
        recover on >=0.34"), which matches no outcome."""
        if self.release or not self.expects.varies:
            return self.expects.for_release(self.release) or "any"
        return ", ".join(f"{value} on {spec}" for spec, value in self.expects.choices)

    @property
    def expected_said(self) -> str:
        """The expectation as a progress line says it: with where it came from, where the file did not write it."""
        return f"{self.expected}, {self.expected_from}" if self.expected_from else self.expected

    def for_release(self, version: str) -> Variant:
        """This variant as vLLM `version` runs it. NoReleaseValue naming the key when a table has no value for it."""
        for key, by_release in ((f"variants.{self.name}.patch", self.patches), (f"expect.{self.name}", self.expects)):
            if by_release is not None and by_release.varies and by_release.for_release(version) is None:
                specs = ", ".join(repr(spec) for spec, _ in by_release.choices)
                raise NoReleaseValue(key, f"no value for vLLM {version} (the table has {specs})")
        return dataclasses.replace(self, release=version)


class NoReleaseValue(ValueError):
    """A value given per release has none for the vLLM a variant runs: `key` is the scenario key, `reason` says why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key, self.reason = key, reason


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
    cpu_scenario: Path | None = None  # the CPU scenario of the same family, for a GPU scenario on a CPU

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
                "patch": _json_paths(v.patches),
                "python": v.python,
                "env": v.env,
                "args": list(v.args),
                "speculative": v.speculative,
                "level": v.level,
                "push_to": list(v.push_to),
                "push_scale": dict(v.push_scale),
                "push_skip": list(v.push_skip),
                "push_fault": v.push_fault,
                "discard_rules": v.discard_rules,
                "model_runner": v.model_runner,
            }
            for v in self.variants
        }
        data["expect"] = {v.name: v.expects.to_json() for v in self.variants} | {
            "tolerance": self.tolerance,
            "min_speedup_recovery": self.min_speedup_recovery,
            **dataclasses.asdict(self.limits),
        }
        return json.loads(json.dumps(data))


def _json_paths(patches: ByRelease[Path] | None) -> str | dict[str, str] | None:
    if patches is None:
        return None
    written = patches.to_json()
    return {spec: str(path) for spec, path in written.items()} if isinstance(written, dict) else str(written)


@dataclass(frozen=True)
class Overrides:
    """Command-line flags that override scenario files."""

    cycles: int | None = None
    tp: int | None = None
    variants: tuple[str, ...] = ()
    patch: Path | None = None
    model_runner: str | None = None  # the runner of every variant the file leaves to vLLM's choice
    expect: str | None = None  # the `patched` variant's expectation (--expect), over the file's

    def adds_patched(self, raw: dict[str, Any]) -> bool:
        """Whether --patch adds a `patched` variant to the TOML document `raw`, which has none."""
        variants = raw.get("variants", {"baseline": {}})
        return self.patch is not None and isinstance(variants, dict) and "patched" not in variants


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
    problem = what_it_is(path)
    if problem is not None:
        raise ScenarioError(str(file), key, f"prompts file {problem}: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
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
            if not item["prompt"].strip():  # vLLM refuses an empty prompt (HTTP 400), as the list form refuses it here
                raise ScenarioError(str(file), key, f'{path}:{n}: empty "prompt"')
            prompts.append(item["prompt"])
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ScenarioError(str(file), key, f"prompts file has no prompts: {path}")
    return tuple(prompts)


def _apply_overrides(raw: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    if overrides.adds_patched(raw):  # --patch names the `patched` variant; add it if the file has none
        raw["variants"] = {**raw.get("variants", {"baseline": {}}), "patched": {}}
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
    file, shown = Path(path), str(path)
    data, raw = _read_toml(file, shown)
    added = overrides.adds_patched(raw)
    try:
        doc = ScenarioFile.model_validate(_apply_overrides(raw, overrides))
    except ValidationError as exc:
        raise error_from_validation(shown, exc) from None
    name = _scenario_name(shown, file, doc)
    doc = _local_models(shown, file, doc)
    variants = [
        variant
        for variant_name, section in _chosen_variants(shown, doc, overrides).items()
        for variant in _resolve_variant(shown, file, doc, variant_name, section, overrides, added)
    ]
    return Scenario(
        name=name,
        file=file.resolve(),
        sha256=hashlib.sha256(data).hexdigest(),
        doc=doc,
        prompts=_load_prompts(file, doc.workload.prompts),
        variants=tuple(variants),
        tolerance=expect.tolerance(doc),
        min_speedup_recovery=expect.min_speedup_recovery(doc),
        limits=expect.limits(doc),
        cpu_scenario=_cpu_scenario(shown, file, doc.cpu_scenario),
    )


def _cpu_scenario(shown: str, file: Path, written: str | None) -> Path | None:
    """`cpu_scenario`, found from the scenario's folder; ScenarioError when no file is there."""
    if written is None:
        return None
    path = (file.parent / written).expanduser()
    problem = what_it_is(path)
    if problem is not None:
        raise ScenarioError(shown, "cpu_scenario", f"{'file not found' if problem == 'not found' else problem}: {path}")
    return path.resolve()


def _read_toml(file: Path, shown: str) -> tuple[bytes, dict[str, Any]]:
    problem = what_it_is(file)
    if problem is not None:
        raise ScenarioError(shown, "", "scenario file not found" if problem == "not found" else problem)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ScenarioError(shown, "", f"cannot read: {exc.strerror}") from None
    try:
        return data, tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ScenarioError(shown, "", "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(shown, "", f"invalid TOML: {exc}") from None


def _scenario_name(shown: str, file: Path, doc: ScenarioFile) -> str:
    name = doc.name if doc.name is not None else file.stem
    if not SAFE_NAME.fullmatch(name):
        origin = "" if doc.name is not None else " (taken from the file name; set `name` in the file)"
        raise ScenarioError(
            shown,
            "name",
            f"{name!r} must be one safe path component — letters, digits, '_', '.', '-' — as it names the run"
            f" folder{origin}",
        )
    return name


def _chosen_variants(shown: str, doc: ScenarioFile, overrides: Overrides) -> dict[str, VariantSection]:
    """The file's variants, or those --variant names."""
    variants = dict(doc.variants)
    for name in overrides.variants:
        if name not in variants:
            raise ScenarioError(shown, "--variant", f"no variant {name!r} (have: {', '.join(variants)})")
    return {n: v for n, v in variants.items() if n in overrides.variants} if overrides.variants else variants


def _resolve_variant(
    shown: str,
    file: Path,
    doc: ScenarioFile,
    name: str,
    section: VariantSection,
    overrides: Overrides,
    added: bool = False,
) -> list[Variant]:
    """One Variant per sleep level ([cycle] level = [1, 2] gives NAME-L1 and NAME-L2). `added`: --patch added the
    `patched` variant."""
    patch = _resolve_patch(shown, file, name, section, overrides)
    python = section.python
    if python and ("/" in python or python.startswith("~")):
        python = str((file.parent / Path(python).expanduser()).resolve())
    levels = doc.cycle.levels
    resolved = []
    for level in levels:
        full = name if len(levels) == 1 else f"{name}-L{level}"
        expected, expected_from = expect.expectation(
            shown, doc, name, full, section.speculative, overrides.expect, added
        )
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
                tuple(section.push_to or doc.cycle.push_to),
                tuple(sorted(section.push_scale.items())),
                tuple(section.push_skip),
                section.push_fault,
                discard_rules=section.discard_rules or doc.cycle.discard_rules,
                model_runner=section.model_runner or doc.server.model_runner or overrides.model_runner,
                model_runner_from=_runner_from(
                    name, section.model_runner, doc.server.model_runner, overrides.model_runner
                ),
                patch_from_flag=name == "patched" and overrides.patch is not None,
                expected_from=expected_from,
            )  # fmt: skip
        )
    return resolved


def _runner_from(variant: str, own: str | None, server: str | None, flag: str | None) -> str:
    """Where a variant's model runner comes from, as an error names it: its table, else the server's, else
    --model-runner; where nothing sets it (vLLM's choice), the server's key, the one that would."""
    if own:
        return f"variants.{variant}.model_runner"
    return "--model-runner" if flag and not server else "server.model_runner"


def _local_path(file: Path, ref: str) -> str:
    """A model reference that is a path (./x, ../x, /x, ~/x) → absolute, relative to the scenario file, so a
    scenario runs the same from any directory; anything else (a Hub id, builtin:NAME) is returned as is."""
    if ref.startswith(("./", "../", "/", "~")):
        return str((file.parent / Path(ref).expanduser()).resolve())
    return ref


def _local_models(shown: str, file: Path, doc: ScenarioFile) -> ScenarioFile:
    """Model paths made absolute; a path that names no folder is refused (exit 2), not left for the Hub to answer."""
    server = doc.server.model_copy(update={"model": _existing(shown, "server.model", file, doc.server.model)})
    speculative = dict(doc.speculative)
    if isinstance(speculative.get("model"), str):
        speculative["model"] = _existing(shown, "speculative.model", file, speculative["model"])
    return doc.model_copy(update={"server": server, "speculative": speculative})


def _existing(shown: str, key: str, file: Path, ref: str) -> str:
    resolved = _local_path(file, ref)
    if resolved != ref and not Path(resolved).is_dir():
        what = "is not a folder" if Path(resolved).exists() else "does not exist"
        raise ScenarioError(shown, key, f"{resolved} {what} (a path names a local model folder)")
    return resolved


def _resolve_patch(
    shown: str, file: Path, name: str, section: VariantSection, overrides: Overrides
) -> ByRelease[Path] | None:
    """The variant's diff, or one per release: every path made absolute and checked to be a file."""
    if name == "patched" and overrides.patch is not None:
        return ByRelease.plain(_existing_patch(shown, "--patch", overrides.patch.expanduser().resolve()))
    if not section.patch:
        return None
    key = f"variants.{name}.patch"
    written = ByRelease.parse(section.patch)  # the file's table was checked when it was read
    return ByRelease(
        tuple(
            (spec, _existing_patch(shown, key, (file.parent / Path(path).expanduser()).resolve()))
            for spec, path in written.choices
        )
    )


def _existing_patch(shown: str, key: str, patch: Path) -> Path:
    """The patch a variant's `patch` or --patch names, a regular file; ScenarioError naming the scenario and key."""
    problem = what_it_is(patch)
    if problem is not None:
        said = {"not found": "patch file not found", "a folder, not a file": "a folder, not a patch file"}
        raise ScenarioError(shown, key, f"{said.get(problem, f'patch file is {problem}')}: {patch}")
    return patch
