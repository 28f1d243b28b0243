"""Small Markdown helpers shared by every renderer: number cells, escaping, code fences.

Pure string functions; nothing here knows about results.
"""

from __future__ import annotations

import re

from specwake.judge.stats import Ratio

MISSING = "–"
SHORT_SHA = 12


def num(value: float | None, digits: int, *, sign: bool = False) -> str:
    if value is None:
        return MISSING
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def ratio_cell(r: Ratio | None) -> str:
    """`0.98 [0.91, 1.04]`: a ratio with its interval, or `(no CI)` where the samples allow none."""
    if r is None or r.value is None:
        return MISSING
    if r.ci_low is None or r.ci_high is None:
        return f"{r.value:.2f} (no CI)"
    return f"{r.value:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"


# A `<` that could open raw HTML: a tag, a closing tag, a comment or declaration, a processing instruction (CommonMark
# 6.6); any other `<` (`n<6`, `a < b`) is text as it stands.
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


def inline(text: str) -> str:
    """Free text made safe for one Markdown line: no raw HTML (a `<` that could open a tag is `&lt;`, any other is
    left as written), no line breaks."""
    return _TAG_OPEN.sub("&lt;", text).replace("\n", " ")


def cell(text: str) -> str:
    """Free text made safe for one table cell."""
    return inline(text).replace("|", "\\|")


def short_sha(sha: str | None) -> str:
    return sha[:SHORT_SHA] if sha else MISSING


def fence(text: str) -> str:
    """A code fence longer than any run of backticks inside `text`."""
    ticks = 3
    while "`" * ticks in text:
        ticks += 1
    return "`" * ticks


def fenced(text: str, lang: str = "") -> list[str]:
    marker = fence(text)
    return [marker + lang, text.rstrip("\n"), marker]


_HTML_LINES = ("<details>", "</details>")


def for_terminal(text: str) -> str:
    """Markdown made for reading in a terminal: our HTML wrappers dropped and escapes undone (`&lt;` → `<`,
    `\\|` → `|`). Files, PR comments and step summaries keep the escaped Markdown."""
    lines = []
    for line in text.splitlines():
        if line.strip() in _HTML_LINES:
            continue
        for tag in ("<summary>", "</summary>", "<sub>", "</sub>"):
            line = line.replace(tag, "")
        lines.append(line.replace("\\|", "|").replace("&lt;", "<"))
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")
