"""[expect] resolved: what each variant expects per vLLM release (outcome sets included), and the bounds."""

from __future__ import annotations

from specwake.errors import ScenarioError
from specwake.judge.expectations import DEFAULT_TOLERANCE, PATCH_DEFAULT, Limits, expectation_text
from specwake.prepare.releases import ByRelease
from specwake.prepare.scenario_file import LIMIT_KEYS, ScenarioFile


def expectation(
    shown: str, doc: ScenarioFile, name: str, full: str, speculative: bool, flag: str | None, added: bool
) -> tuple[ByRelease[str], str | None]:
    """What variant `full` (the file's `name`, at one sleep level) expects, and where that comes from when the file
    does not say it: --expect for the `patched` variant, over the file's; else the file's [expect]; else, for the
    `patched` variant --patch added, `recover` (a fix is tested to recover); else `any`. A variant without
    speculation (the floor) expects nothing: ScenarioError where anything but `any` is written for it."""
    expected, expected_from = _expectation(doc, name, full, flag, added)
    if not speculative and expected.values() != ["any"]:
        raise ScenarioError(
            shown, f"expect.{name}", f"{name!r} runs without speculation (the floor): measured, not judged"
        )
    return expected, expected_from


def _expectation(
    doc: ScenarioFile, name: str, full: str, flag: str | None, added: bool
) -> tuple[ByRelease[str], str | None]:
    if name == "patched" and flag is not None:
        return ByRelease.plain(flag), "--expect"
    written = doc.expect.get(full, doc.expect.get(name))
    if written is None and name == "patched" and added:
        return ByRelease.plain(PATCH_DEFAULT), "--patch default"
    return ByRelease.parse(written if written is not None else "any").map(expectation_text), None


def tolerance(doc: ScenarioFile) -> float:
    """[expect] tolerance: how far below fresh a post-cycle AL may fall and still recover."""
    return float(doc.expect.get("tolerance", DEFAULT_TOLERANCE))


def min_speedup_recovery(doc: ScenarioFile) -> float | None:
    """[expect] min_speedup_recovery; None where the file sets none (see verdict.speed_rule)."""
    min_speedup = doc.expect.get("min_speedup_recovery")
    return None if min_speedup is None else float(min_speedup)


def limits(doc: ScenarioFile) -> Limits:
    """[expect] bounds beyond the outcome (LIMIT_KEYS, graph_safe)."""
    return Limits(
        **{k: float(v) for k, v in doc.expect.items() if k in LIMIT_KEYS},
        graph_safe=bool(doc.expect.get("graph_safe", True)),
    )
