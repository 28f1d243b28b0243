"""What a scenario may expect, and the defaults it gets when it says nothing: the vocabulary of `[expect]`, shared by
the scenario format (specwake.prepare.scenario_file) and the decisions (specwake.judge.verdict). Decides nothing itself.

An expectation is one of EXPECTATIONS, or a set of outcomes where vLLM's code leaves more than one possible (the
allocator's layout decides between them): a TOML list such as `["collapse", "degraded"]`, recorded, printed and judged
as its members in SET_OUTCOMES order joined by `|` ("collapse|degraded").
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

EXPECTATIONS = ("recover", "collapse", "corrupt", "crash", "any")
# The outcomes a set may name: those a judged variant can have (not error, untested or floor, which no expectation
# accepts, nor any, which is no outcome).
SET_OUTCOMES = ("recover", "collapse", "corrupt", "crash", "degraded")
SET_SEPARATOR = "|"
COLLAPSE_AL = 1.05  # AL at or below this after a cycle means (almost) every draft was rejected
DEFAULT_TOLERANCE = 0.05  # [expect] tolerance when a scenario sets none
DEFAULT_MIN_SPEEDUP = 0.9  # [expect] min_speedup_recovery when a scenario sets none
# [expect] max_wake_ratio when a scenario sets none: a wake (and its reload or push) that takes longer than this many
# times the server's own first load of the same weights is a finding. A reload reads the checkpoint the first load
# read, and the first load also built the models: a wake needs less than it. On the repo's CPU runs (640 variant runs,
# warm-started servers, Model Runner V2, a deliberately slow fix aside) the slowest wake was at most 0.47× the first
# load but once (MIN_FIRST_LOAD_S).
DEFAULT_MAX_WAKE_RATIO = 2.0
# The least first load a wake is held to, in seconds: a shorter one counts as this. Both are wall-clock readings, and a
# shared machine stalls a process for up to about a second at any moment: one reload of the tiny CPU pair took 1.35 s
# (its other cycle 0.08 s) against a 0.64 s first load, on a 2-core machine running the whole test suite. A warm-started
# CPU server loads its tiny models in 0.16-0.6 s, where such a stall alone is over 2×. GPU models load in far more.
MIN_FIRST_LOAD_S = 2.0
# What the `patched` variant that `--patch` adds to a scenario without one expects, unless `--expect` or the file's
# `expect.patched` says otherwise: a fix is tested to recover.
PATCH_DEFAULT = "recover"


def unknown_outcome(flag: str, value: str | None) -> str | None:
    """The one line refusing a flag's outcome that is not an expectation (`--expect nope`), or None."""
    if value is None or value in EXPECTATIONS:
        return None
    return f"{flag} {value}: not an outcome (one of {', '.join(EXPECTATIONS)})"


@dataclass(frozen=True)
class Limits:
    """[expect] bounds beyond the outcome; each number None when the scenario sets none."""

    max_logprob_drift: float | None = None  # largest |Δ logprob| against fresh after a cycle
    max_rss_growth_mb: float | None = None  # host RSS after the last cycle's wake minus after the first's
    max_wake_s: float | None = None  # the slowest cycle's wake: wake steps and reload, in seconds
    # the slowest cycle's wake over the server's first load of its weights (by vLLM's log); always judged
    max_wake_ratio: float = DEFAULT_MAX_WAKE_RATIO
    # A tensor the reload put at a new address is a finding: a CUDA graph captured before the sleep still reads the
    # old one. False only for a scenario that never captures graphs (server.enforce_eager).
    graph_safe: bool = True


def expectation_text(raw: object) -> str:
    """An [expect] value as written in a scenario, as specwake records, prints and judges it: one of EXPECTATIONS
    as is, a list of two or more distinct outcomes of SET_OUTCOMES as its members in that order joined by '|'.
    ValueError with a one-line reason (the caller adds file and key) for anything else."""
    if not isinstance(raw, list):
        if isinstance(raw, str) and raw in EXPECTATIONS:
            return raw
        raise ValueError(f"must be one of {', '.join(EXPECTATIONS)}, or a list of outcomes (got {raw!r})")
    names = ", ".join(SET_OUTCOMES)
    if len(raw) < 2:
        what = "an empty list" if not raw else f"a list of one ({raw[0]!r})"
        alone = "; write it as a string" if raw and raw[0] in EXPECTATIONS else ""
        raise ValueError(f"{what}: a list names two or more outcomes of {names}{alone}")
    for member in raw:
        if member not in SET_OUTCOMES:
            close = difflib.get_close_matches(str(member), SET_OUTCOMES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"{member!r} is not an outcome a list may name ({hint}one of {names})")
        if raw.count(member) > 1:
            raise ValueError(f"{member!r} is named twice")
    return SET_SEPARATOR.join(o for o in SET_OUTCOMES if o in raw)


def accepted(expected: str) -> tuple[str, ...] | None:
    """The outcomes a recorded expectation accepts (expectation_text's form); None for `any`, which accepts every
    tested outcome. ValueError for one that is not such a form."""
    if expected == "any":
        return None
    if expected in EXPECTATIONS:
        return (expected,)
    members = expected.split(SET_SEPARATOR)
    if len(members) > 1 and all(m in SET_OUTCOMES for m in members):
        return tuple(members)
    raise ValueError(
        f"unknown expectation {expected!r} (one of {', '.join(EXPECTATIONS)}, or outcomes of"
        f" {', '.join(SET_OUTCOMES)} joined by {SET_SEPARATOR!r})"
    )
