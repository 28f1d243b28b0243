"""The result of `specwake bisect` for a terminal or a PR: the commit found (or why none), then a table of every step.
The search and its records are run/bisect/bisect.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specwake.run.bisect.bisect import BisectOutcome


def render(outcome: BisectOutcome) -> str:
    """The commit found (or why none), then every step."""
    lines = [outcome.note] if outcome.note else []
    if outcome.found is not None:
        c = outcome.found
        lines += [f"{outcome.word} commit: {c.sha}", f"  {c.subject}", f"  author date {c.date}"]
        lines += [f"  {f}" for f in outcome.files] or ["  (no files under vllm/)"]
    else:
        lines.append(outcome.message)
        lines += [f"  candidate {c.short} {c.subject}" for c in outcome.candidates]
    lines += [
        "",
        "| commit | subject | verdict | outcome | AL fresh → after | seconds |",
        "| --- | --- | --- | --- | --- | ---: |",
    ]
    for s in outcome.steps:
        al = (
            "–"
            if s.al_fresh is None
            else f"{s.al_fresh:.2f} → " + " → ".join("–" if a is None else f"{a:.2f}" for a in s.al_after)
        )
        what = f"{s.outcome} (reused)" if s.reused else s.outcome or s.reason
        lines.append(f"| {s.commit.short} | {s.commit.subject} | {s.verdict} | {what} | {al} | {s.seconds:.0f} |")
    reused = [s for s in outcome.steps if s.reused]
    if reused:
        lines.append(f"\n{len(reused)} outcome(s) an earlier bisect measured, reused (--remeasure runs them again):")
        lines += [f"  {s.commit.short} from {s.reused}" for s in reused]
    lines.append(f"\nbisect.json: {outcome.file}")
    return "\n".join(lines) + "\n"
