"""Everything specwake shows a person: progress, errors, the report. The only module importing rich.

On a terminal, progress is a live table (one row per server: starting → fresh → cycle k → stage k, tok/s as
requests finish); in CI or when piped, one timestamped line per event; nothing with --quiet. Reports go to stdout.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from specwake.events import Event
from specwake.report.markdown import for_terminal


def _interactive(console: Console) -> bool:
    return console.is_terminal and not os.environ.get("CI")


class Ui:
    def __init__(self, quiet: bool = False, *, live: bool | None = None, terminal: bool | None = None) -> None:
        self.quiet = quiet
        self._stdout_is_terminal = sys.stdout.isatty() if terminal is None else terminal
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self._t0 = time.monotonic()
        self._live_wanted = _interactive(self.err) if live is None else live
        self._live: Live | None = None
        self._rows: dict[str, tuple[str, float]] = {}

    # -- live table --------------------------------------------------------------------------------

    def __enter__(self) -> Ui:
        if self._live_wanted and not self.quiet:
            self._live = Live(self._table(), console=self.err, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(kind, value, tb)
            self._live = None

    def _table(self) -> Table:
        table = Table(title=f"specwake — {time.monotonic() - self._t0:5.0f} s", title_justify="left", expand=False)
        table.add_column("server")
        table.add_column("status")
        table.add_column("since", justify="right")
        now = time.monotonic()
        for key, (status, since) in self._rows.items():
            table.add_row(escape(key), escape(status), f"{now - since:4.0f} s")
        return table

    # -- output ------------------------------------------------------------------------------------

    def event(self, event: Event) -> None:
        """One progress event; on a terminal, an event about a server updates that server's row."""
        if self.quiet:
            return
        if self._live is not None and event.source is not None:
            self._rows[event.source] = (event.text, time.monotonic())
            self._live.update(self._table())
            return
        elapsed = time.monotonic() - self._t0
        self.err.print(f"[dim][{elapsed:7.1f}s][/dim] {escape(str(event))}", markup=True, emoji=False)

    def error(self, message: str) -> None:
        self.err.print(f"[bold red]error:[/bold red] {escape(message)}", markup=True, emoji=False)

    def note(self, message: str) -> None:
        if not self.quiet:
            self.err.print(escape(message), markup=True, emoji=False)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """A plain-text table on stdout, columns as wide as their widest cell (never wrapped: greppable)."""
        widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
        for row in (headers, *rows):
            sys.stdout.write("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
        sys.stdout.flush()

    def report(self, text: str, *, plain: bool = False) -> None:
        """A report on stdout: the Markdown verbatim when stdout is a file or pipe (pasteable: `report` and `compare`
        output goes to PR comments and step summaries), plain text on a terminal or when `plain` (no HTML wrappers,
        no escapes: `run` prints into CI logs; its Markdown is in report.md and the step summary)."""
        shown = for_terminal(text) if self._stdout_is_terminal or plain else text
        sys.stdout.write(shown if shown.endswith("\n") else shown + "\n")
        sys.stdout.flush()
