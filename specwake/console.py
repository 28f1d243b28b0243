"""Everything specwake shows a person: progress lines, errors, the report. The only module importing rich.

Progress and errors go to stderr (timestamped, one line per event; colour only on a TTY); reports go to stdout.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.markup import escape


class Ui:
    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self.out = Console(highlight=False, soft_wrap=True)
        self._t0 = time.monotonic()

    def event(self, message: str) -> None:
        """One progress line, e.g. `[  12.3s] baseline: stage fresh`."""
        if self.quiet:
            return
        elapsed = time.monotonic() - self._t0
        self.err.print(f"[dim][{elapsed:7.1f}s][/dim] {message}", markup=True, emoji=False)

    def error(self, message: str) -> None:
        self.err.print(f"[bold red]error:[/bold red] {_escape(message)}", markup=True, emoji=False)

    def note(self, message: str) -> None:
        if not self.quiet:
            self.err.print(_escape(message), markup=True, emoji=False)

    def report(self, markdown: str) -> None:
        """The Markdown report, verbatim (pasteable), on stdout."""
        sys.stdout.write(markdown if markdown.endswith("\n") else markdown + "\n")
        sys.stdout.flush()


def _escape(text: str) -> str:
    return escape(text)
