"""A report made to fit one GitHub comment: its blocks (a variant's evidence, a scenario's stage table, ...) left out
in a set order until the text fits, and a note in their place saying what was left out and where it is.

Pure: blocks of lines in, lines out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

COMMENT_LIMIT = 65_536  # characters of one GitHub issue or pull-request comment
NOTE_ROOM = 1_000  # what the note itself may take


@dataclass(frozen=True)
class Block:
    """Lines of the report. `rank`: None for lines always kept, else the order of leaving out (lowest first; among
    equals the last block first); `what`: how the note counts it, one and several ("variant's evidence",
    "variants' evidence")."""

    lines: tuple[str, ...]
    rank: int | None = None
    what: tuple[str, str] = ("block", "blocks")

    @property
    def size(self) -> int:
        return sum(len(line) + 1 for line in self.lines)


def fit(blocks: Sequence[Block], limit: int | None, where: str) -> tuple[list[Block], list[str]]:
    """The blocks to keep so that their text and the note fit in `limit` characters (None: all), and the note that
    counts what was left out and says `where` it is (none when nothing was)."""
    total = sum(block.size for block in blocks)
    if limit is None or total <= limit:
        return list(blocks), []
    order = sorted((i for i, b in enumerate(blocks) if b.rank is not None), key=lambda i: (blocks[i].rank, -i))
    left: set[int] = set()
    for index in order:
        if total <= limit - NOTE_ROOM:
            break
        left.add(index)
        total -= blocks[index].size
    counts: dict[tuple[str, str], int] = {}
    for index in sorted(left):
        counts[blocks[index].what] = counts.get(blocks[index].what, 0) + 1
    said = ", ".join(f"{n} {what[0] if n == 1 else what[1]}" for what, n in counts.items())
    note = f"> ✂️ Shortened to fit one GitHub comment ({limit:,} characters), left out: {said}. {where}"
    return [b for i, b in enumerate(blocks) if i not in left], [note]
