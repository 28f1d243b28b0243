"""Progress events: what specwake tells the person running it while it works.

An event is about one server (`source`: its variant, or `scenario/variant` in a run of several scenarios) or
about the whole run (no source). The console groups a server's events into one live row; in CI each event is
one line, `source: text`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    text: str
    source: str | None = None

    def __str__(self) -> str:
        return f"{self.source}: {self.text}" if self.source else self.text

    def within(self, scenario: str) -> Event:
        """The same event named inside its scenario (a run of several scenarios): `eagle3/baseline`."""
        return Event(self.text, f"{scenario}/{self.source}") if self.source else self


Events = Callable[[Event], None]
