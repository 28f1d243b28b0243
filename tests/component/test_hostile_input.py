"""Hostile and malformed input through the CLI: each case exits 2 with one line naming file and key, and
launches nothing (the fake engine records every server start). Shares the BAD scenario table with test_scenario.py
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specwake.cli import app
from tests.helpers.fakeengine import FakeEngine, run_cli, scenario_text
from tests.helpers.scenario_texts import BAD, MINIMAL

Case = Callable[[Path, FakeEngine], tuple[list[str], str, str]]  # → (argv after `run`, where, phrase)

GOOD_HUNK = "@@ -1,2 +1,2 @@\n # Whether reload_weights also reloads the drafter (the bug of vLLM issue #52479).\n"
HUNK = GOOD_HUNK + "-RELOADS_DRAFT = False\n+RELOADS_DRAFT = True\n"
STALE_DIFF = (
    "--- a/vllm/drafter_reload.py\n+++ b/vllm/drafter_reload.py\n"
    + GOOD_HUNK.replace("reloads the drafter", "reloads the turbo")
    + "-RELOADS_DRAFT = False\n+RELOADS_DRAFT = True\n"
)


def _patch_case(body: str | bytes, phrase: str) -> Case:
    def case(tmp: Path, engine: FakeEngine) -> tuple[list[str], str, str]:
        diff = tmp / "bad.diff"
        diff.write_bytes(body if isinstance(body, bytes) else body.encode())
        scenario = tmp / "s.toml"
        scenario.write_text(scenario_text(engine, variants={"baseline": {}, "patched": {}}, patch=str(diff)))
        return [str(scenario)], f"{scenario}: variants.patched.patch", phrase

    return case


def _scenario_case(text: str, key: str, phrase: str, files: dict[str, bytes] | None = None) -> Case:
    def case(tmp: Path, engine: FakeEngine) -> tuple[list[str], str, str]:
        for name, data in (files or {}).items():
            (tmp / name).write_bytes(data)
        scenario = tmp / "s.toml"
        scenario.write_text(text.replace("@PYTHON@", str(engine.python)))
        return [str(scenario)], f"{scenario}: {key}", phrase

    return case


def _flag_case(flags: list[str], where: str, phrase: str) -> Case:
    def case(tmp: Path, engine: FakeEngine) -> tuple[list[str], str, str]:
        (tmp / "turbo.diff").write_text(STALE_DIFF)  # @TMP@/turbo.diff: a diff whose context the package lacks
        scenario = tmp / "s.toml"
        scenario.write_text(scenario_text(engine))
        return [str(scenario), *[f.replace("@TMP@", str(tmp)) for f in flags]], where, phrase

    return case


FAKE = MINIMAL.replace('"builtin:tiny-llama"', '"fake-model"') + '[variants.baseline]\npython = "@PYTHON@"\n'

NEW_CASES: dict[str, Case] = {
    "binary patch (git)": _patch_case(
        "diff --git a/vllm/x.bin b/vllm/x.bin\nGIT binary patch\nliteral 3\nKcmZ>\n", "binary patch"
    ),
    "binary patch (NUL bytes)": _patch_case(b"--- a/vllm/a.py\n+++ b/vllm/a.py\n\x00\x01", "binary patch"),
    "empty patch": _patch_case("", "empty diff"),
    "patch outside vllm/": _patch_case(
        "--- a/docs/x.md\n+++ b/docs/x.md\n@@ -1 +1 @@\n-a\n+b\n", "no file under vllm/"
    ),
    "patch with ../": _patch_case(
        "--- a/vllm/../../etc/passwd\n+++ b/vllm/../../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "leaves the package"
    ),
    "patch with absolute path": _patch_case("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "absolute path"),
    "patch not a diff": _patch_case("just some words\n", "not a unified diff"),
    "patch that does not apply": _patch_case(STALE_DIFF, "drafter_reload.py"),
    "prompts file empty": _scenario_case(
        FAKE + '[workload]\nprompts = "p.txt"\n', "workload.prompts", "no prompts", {"p.txt": b"\n\n"}
    ),
    "prompts file not UTF-8": _scenario_case(
        FAKE + '[workload]\nprompts = "p.txt"\n', "workload.prompts", "not UTF-8", {"p.txt": b"\xff\xfe\x00bad"}
    ),
    "prompts jsonl without prompt": _scenario_case(
        FAKE + '[workload]\nprompts = "p.jsonl"\n', "workload.prompts", '"prompt" string', {"p.jsonl": b'{"q": 1}\n'}
    ),
    "prompts jsonl with an empty prompt": _scenario_case(  # vLLM answers it HTTP 400, after a server start
        FAKE + '[workload]\nprompts = "p.jsonl"\n',
        "workload.prompts",
        'p.jsonl:2: empty "prompt"',
        {"p.jsonl": b'{"prompt": "one two"}\n{"prompt": ""}\n'},
    ),
    "variant env non-string": _scenario_case(
        FAKE.replace("python =", "env = { A = 1 }\npython ="), "variants.baseline.env", "must be a string"
    ),
    "args reserved --speculative-config": _scenario_case(
        FAKE.replace("[server]", "[server]\nargs = ['--speculative-config', '{}']"),
        "server.args",
        "[speculative] table",
    ),
    "args dotted --speculative-config.KEY": _scenario_case(
        FAKE.replace("[server]", "[server]\nargs = ['--speculative-config.num_speculative_tokens=5']"),
        "server.args",
        "set num_speculative_tokens under [speculative] instead",
    ),
    "args reserved --enable-sleep-mode": _scenario_case(
        FAKE.replace("[server]", "[server]\nargs = ['--enable-sleep-mode']"), "server.args", "set by specwake"
    ),
    "unknown cycle key": _scenario_case(FAKE + "[cycle]\ncout = 2\n", "cycle.cout", "did you mean 'count'"),
    "unknown variant key": _scenario_case(
        FAKE.replace("python =", "pyton = 'x'\npython ="), "variants.baseline.pyton", "did you mean 'python'"
    ),
    "startup timeout zero": _scenario_case(
        FAKE.replace("[server]", "[server]\nstartup_timeout_s = 0"), "server.startup_timeout_s", "greater than 0"
    ),
    "cpu_scenario missing": _scenario_case('cpu_scenario = "none.toml"\n' + FAKE, "cpu_scenario", "file not found"),
    "scenario name climbs out of --output": _scenario_case('name = "../../etc"\n' + FAKE, "name", "safe path"),
    "scenario name with a slash": _scenario_case('name = "a/b"\n' + FAKE, "name", "safe path component"),
    "scenario name empty": _scenario_case('name = ""\n' + FAKE, "name", "safe path component"),
    "variant name with a dot-dot": _scenario_case(FAKE + "[variants.'..']\n", "variants", "may use only"),
    "not UTF-8 scenario": _scenario_case("\udcff", "", ""),  # replaced below: bytes
    "--tp 0": _flag_case(["--tp", "0"], "--tp", "greater than or equal to 1"),
    "--cycles -1": _flag_case(["--cycles", "-1"], "--cycles", "greater than or equal to 1"),
    "--gpus bad": _flag_case(["--gpus", "zero-7"], "--gpus", "zero"),
    "--gpus reversed": _flag_case(["--gpus", "7-0"], "--gpus", "7-0"),
    "--variant unknown": _flag_case(["--variant", "nope"], "--variant", "no variant 'nope'"),
    "--patch missing": _flag_case(["--patch", "@TMP@/none.diff"], "s.toml: --patch", "patch file not found"),
    "--patch a folder": _flag_case(["--patch", "@TMP@"], "s.toml: --patch", "a folder, not a patch file"),
    "--patch that does not apply": _flag_case(["--patch", "@TMP@/turbo.diff"], "s.toml: --patch", "drafter_reload.py"),
    "two run modes": _flag_case(["--interleave", "--sequential"], "--interleave, --sequential", "choose one"),
    "--expect not an outcome": _flag_case(
        ["--patch", "@TMP@/turbo.diff", "--expect", "fixed"], "--expect fixed", "not an outcome (one of recover,"
    ),
    "--expect without --patch": _flag_case(["--expect", "recover"], "--expect recover", "only with --patch"),
    "--resume not a folder": _flag_case(["--resume", "@TMP@/none"], "--resume", "not a run folder"),
}


def _not_utf8(tmp: Path, engine: FakeEngine) -> tuple[list[str], str, str]:
    scenario = tmp / "s.toml"
    scenario.write_bytes(b"name = '\xff'\n")
    return [str(scenario)], str(scenario), "not UTF-8"


def _same_names(tmp: Path, engine: FakeEngine) -> tuple[list[str], str, str]:
    first, second = tmp / "a.toml", tmp / "b.toml"
    first.write_text('name = "twin"\n' + FAKE.replace("@PYTHON@", str(engine.python)))
    second.write_text('name = "twin"\n' + FAKE.replace("@PYTHON@", str(engine.python)))
    return [str(first), str(second)], f"{second}: name", f"also the name of {first}"


def _bad_stem(tmp: Path, engine: FakeEngine) -> tuple[list[str], str, str]:
    scenario = tmp / "my scenario.toml"
    scenario.write_text(FAKE.replace("@PYTHON@", str(engine.python)))
    return [str(scenario)], f"{scenario}: name", "taken from the file name"


NEW_CASES["not UTF-8 scenario"] = _not_utf8
NEW_CASES["two scenarios with one name"] = _same_names
NEW_CASES["file name unusable as a name"] = _bad_stem

CASES = {
    f"scenario_test[{i}] {key}": _scenario_case(text.replace("[server]", "[server]"), key, phrase)
    for i, (text, key, phrase) in enumerate(BAD)
} | NEW_CASES


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_one_line_nothing_launched(tmp_path: Path, engine: FakeEngine, name: str) -> None:
    args, where, phrase = CASES[name](tmp_path, engine)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", *args, "--output", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 or "Usage:" in result.output, result.output  # typer's own flag errors keep usage
    text = " ".join(result.output.split())
    assert where in text and phrase in text, result.output
    assert engine.launched() == []  # no server started
    assert not out.exists() or list(out.iterdir()) == []  # no run folder (the writability probe may make `out`)


# What `run` refuses through a flag `check` does not take: nothing for check to refuse first.
RUN_ONLY = {"--resume not a folder": "--resume names a run folder to finish; check plans no run folder"}


@pytest.mark.parametrize("name", [name for name in CASES if name not in RUN_ONLY])
def test_check_refuses_first_what_run_refuses(tmp_path: Path, engine: FakeEngine, name: str) -> None:
    """Every input of the table above that `run` refuses, `check` refuses the same way: exit 2, the same file, key
    and reason, nothing launched."""
    args, where, phrase = CASES[name](tmp_path, engine)
    result = CliRunner().invoke(app, ["check", *args])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert where in text and phrase in text, result.output
    assert engine.launched() == []


def test_check_refuses_gpus_run_would_refuse(tmp_path: Path, engine: FakeEngine) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine, variants={"baseline": {}, "patched": {}}))
    for command, extra in (("run", ["--output", str(tmp_path / "out")]), ("check", [])):
        args = [command, str(scenario), "--gpus", "0-5", *extra]
        proc = run_cli(args, tmp_path / "cache", FAKE_VLLM_PLATFORM="cuda")
        assert proc.returncode == 2, (command, proc.stdout + proc.stderr)
        error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert error == ["error: --gpus: GPU 4 is not visible to vLLM here (4 visible, indices 0-3; indices count"
                         " inside CUDA_VISIBLE_DEVICES)"], (command, error)  # fmt: skip
    assert engine.launched() == []


@pytest.mark.parametrize("what", ["scenario", "patch", "prompts", "--patch", "result"])
def test_a_fifo_where_a_file_belongs_is_refused_not_read(engine: FakeEngine, tmp_path: Path, what: str) -> None:
    """Reading a FIFO blocks until a writer comes: every path a user names is checked for what it is first."""
    import os
    import subprocess
    import sys

    from tests.helpers.fakeengine import cli_env
    from tests.helpers.paths import REPO

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    scenario = tmp_path / "s.toml"
    text = scenario_text(engine)
    args = ["run", str(scenario), "--output", str(tmp_path / "out")]
    if what == "scenario":
        args[1] = str(fifo)
    elif what == "patch":
        text = scenario_text(engine, variants={"baseline": {}, "patched": {}}, patch=str(fifo))
    elif what == "prompts":
        text = text.replace('prompts = ["one two three", "four five"]', f'prompts = "{fifo}"')
    elif what == "--patch":
        args += ["--patch", str(fifo)]
    else:
        args = ["report", str(fifo)]
    scenario.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "specwake.cli", *args], cwd=REPO, env=cli_env(tmp_path / "cache"),
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "not a regular file" in proc.stderr and str(fifo) in proc.stderr
    assert engine.launched() == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("below", ["", "results/night"])
def test_an_output_that_is_a_file_is_bad_input(tmp_path: Path, engine: FakeEngine, below: str) -> None:
    """--output naming a file (or a path through one) is the user's mistake, exit 2 naming --output and the file;
    not the machine's (exit 3: a folder it may not write)."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine))
    blocker = tmp_path / "results.txt"
    blocker.write_text("not a folder")
    out = blocker / below if below else blocker
    result = CliRunner().invoke(app, ["run", str(scenario), "--output", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: --output: {f'{out}: ' if below else ''}{blocker} is a file, not a folder"
    ]
    assert engine.launched() == [] and blocker.read_text() == "not a folder"
