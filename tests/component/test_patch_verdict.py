"""`--patch` gives a verdict on the fix, through the real CLI against the fake engine (tests/helpers/fakeengine.py):
the `patched` variant it adds to a scenario without one expects `recover`, so a fix that leaves the drafter
collapsed fails the run; `--expect` says otherwise; the progress line says which expectation was used; and `check`
warns in one line where the patch's header names releases other than the installed vLLM.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specwake.cli import app
from tests.helpers.fakeengine import BEHAVIOUR, BEHAVIOUR_TEXT, FakeEngine, result_of, scenario_text
from tests.helpers.fakeengine import variant as variant_of

# A planted wrong fix: it applies, and changes nothing the drafter's reload does (the drafter stays discarded).
FIRST, SECOND = BEHAVIOUR_TEXT.splitlines()
NO_FIX = (
    f"--- a/{BEHAVIOUR}\n+++ b/{BEHAVIOUR}\n@@ -1,2 +1,2 @@\n-{FIRST}\n+{FIRST.replace('(the bug', '(still the bug')}\n"
    f" {SECOND}\n"
)


@pytest.fixture
def fake_default(engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """The fake engine as the interpreter a variant without `python` runs (specwake's own, sys.executable): the
    variant --patch adds names none. The CLI runs in-process (CliRunner)."""
    monkeypatch.setattr(sys, "executable", str(engine.python))
    return engine


def specwake(*args: str) -> tuple[int, str]:
    """The CLI in-process: exit code, and everything it printed."""
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def _line(output: str, name: str) -> str:
    return next(line for line in output.splitlines() if f"{name}: " in line and "(expected " in line)


def _run(tmp: Path, engine: FakeEngine, *flags: str) -> tuple[int, str, Path]:
    scenario, out = tmp / "s.toml", tmp / "out"
    scenario.write_text(scenario_text(engine, expect={"baseline": "collapse"}))  # no `patched` variant
    (tmp / "nofix.diff").write_text(NO_FIX)
    code, output = specwake("run", str(scenario), "--output", str(out), "--patch", str(tmp / "nofix.diff"), *flags)
    assert engine.survivors() == []
    return code, output, out


def test_a_fix_that_collapses_fails_the_run_as_the_patch_default_expects_recover(
    fake_default: FakeEngine, tmp_path: Path
) -> None:
    code, output, out = _run(tmp_path, fake_default)
    assert code == 1, output[-3000:]  # FAIL: the fix collapses
    patched = variant_of(result_of(out), "patched")
    assert (patched["outcome"], patched["expected"]) == ("collapse", "recover")
    assert _line(output, "patched").endswith("patched: collapse (expected recover, --patch default)")


def test_expect_says_what_the_added_variant_must_do_and_the_line_says_so(
    fake_default: FakeEngine, tmp_path: Path
) -> None:
    code, output, out = _run(tmp_path, fake_default, "--expect", "collapse")
    assert code == 0, output[-3000:]
    assert variant_of(result_of(out), "patched")["expected"] == "collapse"
    assert _line(output, "patched").endswith("patched: collapse (expected collapse, --expect)")


def test_check_warns_in_one_line_where_the_patch_header_names_other_releases(
    fake_default: FakeEngine, tmp_path: Path
) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(fake_default, expect={"baseline": "collapse"}))
    fix = fake_default.write_fix(tmp_path)
    headed = tmp_path / "headed.diff"
    headed.write_text("A fix, made for its releases (vLLM 0.32.0, 0.33.0).\n\n" + fix.read_text())
    code, output = specwake("check", str(scenario), "--patch", str(headed))
    assert code == 0, output
    warnings = [line for line in output.splitlines() if "was made for vLLM" in line]
    assert len(warnings) == 1, output
    assert warnings[0].endswith(
        f"warning: {scenario}: --patch: headed.diff was made for vLLM 0.32.0, 0.33.0 (its header), not the installed"
        " 0.0.fake: it may not fix this release"
    )
    assert "variant patched  (expect recover, --patch default)" in output
    code, output = specwake("check", str(scenario), "--patch", str(fix))
    assert code == 0 and "was made for" not in output, output  # no header: nothing to compare
