"""Patches made from the reference fix by the end-to-end tests: lines added to one of its hunks, the hunk's header
counting them, so each almost-right fix is the reference fix plus a few lines of its own."""

from __future__ import annotations

import re


def insert_after(diff: str, anchor: str, lines: str) -> str:
    """`diff` with `lines` (added lines, each starting with '+') right after the line `anchor`, its hunk's header
    counting them."""
    at = diff.index(anchor) + len(anchor)
    header = list(re.finditer(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@", diff[:at], re.MULTILINE))[-1]
    grown = int(header.group(4)) + lines.count("\n")
    new_header = f"@@ -{header.group(1)},{header.group(2)} +{header.group(3)},{grown} @@"
    return diff[: header.start()] + new_header + diff[header.end() : at] + lines + diff[at:]


def without_file(diff: str, path: str) -> str:
    """`diff` without its changes to `path` (the section from its `diff --git a/PATH` line to the next file's);
    ValueError where the diff does not change that file."""
    start = diff.find(f"diff --git a/{path} b/{path}\n")
    if start < 0:
        raise ValueError(f"the diff does not change {path}")
    following = diff.find("\ndiff --git ", start + 1)
    return diff[:start] + (diff[following + 1 :] if following >= 0 else "")
