"""What a scenario may expect, and the defaults it gets when it says nothing: the vocabulary of `[expect]`, shared by
the scenario format (specwake.prepare.scenario_file) and the decisions (specwake.judge.verdict). Decides nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPECTATIONS = ("recover", "collapse", "corrupt", "crash", "any")
COLLAPSE_AL = 1.05  # AL at or below this after a cycle means (almost) every draft was rejected
DEFAULT_TOLERANCE = 0.05  # [expect] tolerance when a scenario sets none
DEFAULT_MIN_SPEEDUP = 0.9  # [expect] min_speedup_recovery when a scenario sets none
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
    # A tensor the reload put at a new address is a finding: a CUDA graph captured before the sleep still reads the
    # old one. False only for a scenario that never captures graphs (server.enforce_eager).
    graph_safe: bool = True
