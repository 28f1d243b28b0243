"""Progress output: plain timestamped lines off a terminal, a live per-server table on one, nothing with --quiet."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from specwake.console import Ui
from specwake.events import Event


def capture(ui: Ui) -> io.StringIO:
    buffer = io.StringIO()
    ui.err = Console(file=buffer, force_terminal=False, width=200)
    return buffer


def test_an_event_reads_as_source_and_text_and_names_its_scenario_in_a_packed_run() -> None:
    assert str(Event("stage fresh", "baseline")) == "baseline: stage fresh"
    assert str(Event("stage fresh", "baseline").within("tiny-cpu")) == "tiny-cpu/baseline: stage fresh"
    assert str(Event("probing vLLM in /x: y")) == "probing vLLM in /x: y"
    assert Event("results in /r").within("tiny-cpu").source is None  # a run-wide line stays run-wide


def test_plain_lines_when_not_a_terminal() -> None:
    ui = Ui(live=False)
    out = capture(ui)
    with ui:
        ui.event(Event("stage fresh", "baseline"))
        ui.event(Event("results in /tmp/x"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].endswith("baseline: stage fresh") and lines[0].startswith("[")


def test_quiet_prints_no_progress_but_errors(capsys: pytest.CaptureFixture[str]) -> None:
    ui = Ui(quiet=True, live=False)
    out = capture(ui)
    with ui:
        ui.event(Event("stage fresh", "baseline"))
        ui.note("a note")
        ui.error("bad thing")
    assert out.getvalue().strip() == "error: bad thing"


def test_live_table_keeps_one_row_per_server() -> None:
    ui = Ui(live=True)
    out = io.StringIO()
    ui.err = Console(file=out, force_terminal=True, width=120)
    with ui:
        ui.event(Event("stage fresh", "baseline"))
        ui.event(Event("fresh: request 1/3: 512.0 tok/s", "baseline"))
        ui.event(Event("starting server", "patched"))
    assert list(ui._rows) == ["baseline", "patched"]
    assert ui._rows["baseline"][0] == "fresh: request 1/3: 512.0 tok/s"
    assert "512.0 tok/s" in out.getvalue()


def test_report_goes_to_stdout_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    Ui().report("| a | b |")
    assert capsys.readouterr().out == "| a | b |\n"


MARKDOWN = (
    "- **patched**: recover — interval up to 0.88 &lt; 0.90\n\n<details>\n<summary>patched: steps</summary>\n\n"
    "| a \\| b | c |\n</details>\n\n<sub>tok/s CI: range (n&lt;6)</sub>\n"
)


def test_a_terminal_sees_plain_text_a_pipe_the_escaped_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    Ui(terminal=True).report(MARKDOWN)
    shown = capsys.readouterr().out
    assert "&lt;" not in shown and "<details>" not in shown and "<sub>" not in shown and "\\|" not in shown
    assert "interval up to 0.88 < 0.90" in shown and "tok/s CI: range (n<6)" in shown and "| a | b | c |" in shown
    Ui(terminal=False).report(MARKDOWN)
    assert capsys.readouterr().out == MARKDOWN
