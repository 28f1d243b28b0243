"""A patch and an expectation per vLLM release, through the real CLI on the fake engine with its version set: `check`
names the patch and the expectation for the installed release and for every tested one, `run` applies the release's
patch and judges by the release's expectation, a table that misses the installed release is refused before anything
starts, and a release specwake was not tested against is said in one line, the exit status unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.prepare.releases import TESTED_RELEASES
from tests.helpers.fakeengine import BEHAVIOUR, FakeEngine, result_of, run_cli, run_text, scenario_text, variant

# Does nothing to the fake drafter: a patch that is not the fix for the release it is given to.
NOT_THE_FIX = f"""\
--- a/{BEHAVIOUR}
+++ b/{BEHAVIOUR}
@@ -1,2 +1,3 @@
 # Whether reload_weights also reloads the drafter (the bug of vLLM issue #52479).
 RELOADS_DRAFT = False
+# (a patch for another release)
"""


def released(engine: FakeEngine, version: str) -> FakeEngine:
    """The fake vLLM says it is `version`."""
    (engine.package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    return engine


def scenario(engine: FakeEngine, tmp_path: Path, patched: str = "recover") -> Path:
    """baseline and patched; patched's diff is the fix on >=0.34 only; its expectation `patched` on >=0.34 and
    collapse before."""
    (tmp_path / "old.diff").write_text(NOT_THE_FIX)
    engine.write_fix(tmp_path).rename(tmp_path / "new.diff")
    text = scenario_text(engine, variants={"baseline": {}, "patched": {}}, expect={"baseline": "collapse"})
    text = text.replace(
        "[variants.patched]\n", '[variants.patched]\npatch = { "<0.34" = "old.diff", ">=0.34" = "new.diff" }\n'
    )
    text += f'patched = {{ "<0.34" = "collapse", ">=0.34" = "{patched}" }}\n'
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("version", "patch", "expected"), [("0.33.0", "old.diff", "collapse"), ("0.34.0", "new.diff", "recover")]
)
def test_check_names_the_patch_and_the_expectation_for_the_installed_release_and_every_tested_one(
    engine: FakeEngine, tmp_path: Path, version: str, patch: str, expected: str
) -> None:
    path = scenario(released(engine, version), tmp_path)
    proc = run_cli(["check", str(path)], tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    spec = "<0.34" if version == "0.33.0" else ">=0.34"
    assert f"patch: {tmp_path / patch} (for vLLM {version}, chosen by '{spec}')" in out
    per_release = ", ".join(f"{r} {'old' if r < '0.34' else 'new'}.diff" for r in TESTED_RELEASES)
    assert f"patch per tested release: {per_release}" in out
    assert f"expectation: {expected} for vLLM {version} (chosen by '{spec}')" in out
    assert f"patched: expect {expected};" in out
    assert "untested release" not in out and "not a release specwake was tested" not in proc.stderr


def test_run_applies_the_releases_patch_and_judges_by_its_expectation(engine: FakeEngine, tmp_path: Path) -> None:
    for version, outcome in (("0.34.0", "recover"), ("0.33.0", "collapse")):
        folder = tmp_path / version
        folder.mkdir()
        proc, out = run_text(released(engine, version), folder, scenario(engine, folder).read_text())
        assert proc.returncode == 0, proc.stdout + proc.stderr
        patched = variant(result_of(out), "patched")
        assert (patched["outcome"], patched["expected"], patched["vllm_version"]) == (outcome, outcome, version)
        assert Path(patched["patch"]).name == ("new.diff" if version == "0.34.0" else "old.diff")


def test_a_release_the_table_does_not_reach_is_refused_before_anything_starts(
    engine: FakeEngine, tmp_path: Path
) -> None:
    path = scenario(released(engine, "0.31.0"), tmp_path)
    path.write_text(path.read_text().replace('"<0.34" = "old.diff"', '">=0.32,<0.34" = "old.diff"'))
    for command in (["check"], ["run", "--output", str(tmp_path / "out")]):
        proc = run_cli([*command, str(path)], tmp_path / "cache")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert errors == [
            f"error: {path}: variants.patched.patch: no value for vLLM 0.31.0 (the table has '>=0.32,<0.34', '>=0.34')"
        ], proc.stderr
    assert engine.launched() == [] and not (tmp_path / "out").exists()


def test_a_table_that_leaves_a_tested_release_out_is_bad_input(engine: FakeEngine, tmp_path: Path) -> None:
    path = scenario(released(engine, "0.34.0"), tmp_path)
    path.write_text(path.read_text().replace('patched = { "<0.34" = "collapse"', 'patched = { "<0.33" = "collapse"'))
    proc = run_cli(["check", str(path)], tmp_path / "cache")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {path}: expect.patched: no value for vLLM 0.33.0 (tested releases:" in proc.stderr


def test_an_untested_release_is_said_in_one_line_and_changes_no_exit_status(engine: FakeEngine, tmp_path: Path) -> None:
    path = scenario(released(engine, "0.35.0"), tmp_path)
    check = run_cli(["check", str(path)], tmp_path / "cache")
    proc, out = run_text(engine, tmp_path, path.read_text())
    for step in (check, proc):
        assert step.returncode == 0, step.stdout + step.stderr  # 0.35 takes '>=0.34': the fix, expected recover
        said = [line for line in step.stderr.splitlines() if "not a release specwake was tested against" in line]
        assert len(said) == 1, step.stderr
        assert f"vLLM 0.35.0 ({engine.python}) is not a release specwake was tested against" in said[0]
        assert ", ".join(TESTED_RELEASES) in said[0]
    assert "(untested release; tested: " in check.stdout
    assert variant(result_of(out), "patched")["outcome"] == "recover"


def test_direct_reload_mode_is_refused_on_a_release_that_reads_it_and_passed_through_on_one_that_does_not(
    engine: FakeEngine, tmp_path: Path
) -> None:
    """VLLM_RELOAD_MODE=direct in specwake's environment (the allow-list hands it to every server): vLLM 0.34 would
    reload the target in place and the drafter layerwise, so check and run stop before anything starts; 0.33 does not
    read it."""
    path = scenario(released(engine, "0.34.0"), tmp_path)
    for command in (["check"], ["run", "--output", str(tmp_path / "out")]):
        proc = run_cli([*command, str(path)], tmp_path / "cache", VLLM_RELOAD_MODE="direct")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(
            f'error: {path}: VLLM_RELOAD_MODE in specwake\'s environment, which every server inherits: "direct":'
            " vLLM 0.34.0 would reload the target in place while the drafter's reload"
        ), proc.stderr
    assert engine.launched() == [] and not (tmp_path / "out").exists()
    older = scenario(released(engine, "0.33.0"), tmp_path)
    proc = run_cli(["check", str(older)], tmp_path / "cache-0.33", VLLM_RELOAD_MODE="direct")
    assert proc.returncode == 0, proc.stdout + proc.stderr
