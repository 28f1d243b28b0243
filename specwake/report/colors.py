"""Colours of variants in every picture: a variant's colour follows its name, never its position.

The shipped scenarios' variant names have fixed colours (matplotlib's tab10, in the order the scenarios use them);
any other name takes a colour from the rest of the palette by a hash of the name, and where two names of one
picture meet on a colour, the later name in sorted order takes the next free one. So a variant keeps its colour
across panels, scenarios, runs and nights. Pure: hex strings, no matplotlib.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

KNOWN = {
    "baseline": "#1f77b4",  # blue
    "patched": "#ff7f0e",  # orange
    "target-and-draft": "#2ca02c",  # green
    "target-only": "#d62728",  # red
    "preserve": "#9467bd",  # purple
    "floor": "#8c564b",  # brown
}
OTHERS = (
    "#e377c2",  # pink
    "#17becf",  # cyan
    "#bcbd22",  # olive
    "#7f7f7f",  # grey
    "#393b79",  # indigo
    "#637939",  # moss
    "#8c6d31",  # ochre
    "#843c39",  # brick
    "#7b4173",  # plum
    "#3182bd",  # steel blue
)


def variant_colors(names: Iterable[str]) -> dict[str, str]:
    """Variant name → hex colour, for every name that one picture draws."""
    wanted = set(names)
    colors = {name: KNOWN[name] for name in wanted if name in KNOWN}
    taken = set(colors.values())
    for name in sorted(wanted - colors.keys()):
        start = zlib.crc32(name.encode()) % len(OTHERS)
        ring = [OTHERS[(start + i) % len(OTHERS)] for i in range(len(OTHERS))]
        colors[name] = next((c for c in ring if c not in taken), ring[0])
        taken.add(colors[name])
    return colors
