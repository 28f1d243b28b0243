"""Scenario loading: defaults, resolution, overrides, and every error path as one line with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specwake.cli import app
from specwake.errors import ScenarioError
from specwake.prepare.scenario import BUILTIN_PROMPTS, Overrides, load_scenario
from tests.helpers.paths import REPO
from tests.helpers.scenario_texts import BAD, MINIMAL


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_follow_design(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, MINIMAL, "my-scn.toml"))
    assert s.name == "my-scn"
    assert (s.server.tensor_parallel_size, s.server.enforce_eager, s.server.dtype) == (
        1,
        False,
        "auto",
    )
    assert (s.workload.max_tokens, s.workload.repeats, s.workload.warmup) == (256, 5, 1)
    assert (s.workload.temperature, s.workload.ignore_eos) == (0.0, True)
    assert (s.cycle.level, s.cycle.count, s.cycle.discard) == (2, 2, "auto")
    assert [v.name for v in s.variants] == ["baseline"]
    assert s.variants[0].expected == "any"
    assert s.tolerance == 0.05
    assert s.prompts == BUILTIN_PROMPTS["mixed"]
    assert len(s.sha256) == 64


def test_shipped_tiny_cpu_scenario_resolves() -> None:
    s = load_scenario(REPO / "scenarios" / "tiny-cpu.toml")
    assert s.name == "tiny-cpu"
    assert {v.name: v.expected for v in s.variants} == {
        "baseline": "collapse",
        "patched": "recover",
    }
    patched = next(v for v in s.variants if v.name == "patched")
    patches = REPO / "scenarios" / "patches"
    assert patched.patch is None  # one per release, chosen when the variant's vLLM is known
    assert patched.for_release("0.32.0").patch == patches / "draft-reload.diff"
    assert patched.for_release("0.34.0").patch == patches / "draft-reload-0.34.diff"
    assert s.speculative["num_speculative_tokens"] == 3
    assert s.cycle.count == 2 and s.workload.repeats == 5 and s.workload.max_tokens == 64
    assert s.min_speedup_recovery is None  # speed is advisory where the discard is emulated


def test_prompt_files_relative_to_scenario(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    txt = load_scenario(write(tmp_path, MINIMAL + '[workload]\nprompts = "p.txt"\n'))
    jsonl = load_scenario(write(tmp_path, MINIMAL + '[workload]\nprompts = "p.jsonl"\n'))
    assert txt.prompts == ("one", "two")
    assert jsonl.prompts == ("a", "b")


def test_tp_override_reaches_a_named_draft_tp(tmp_path: Path) -> None:
    text = MINIMAL.replace("num_speculative_tokens = 3", "num_speculative_tokens = 3\ndraft_tensor_parallel_size = 1")
    s = load_scenario(write(tmp_path, text), Overrides(tp=4))
    assert s.server.tensor_parallel_size == 4 and s.speculative["draft_tensor_parallel_size"] == 4
    plain = load_scenario(write(tmp_path, MINIMAL, "plain.toml"), Overrides(tp=4))
    assert "draft_tensor_parallel_size" not in plain.speculative


def test_overrides_apply(tmp_path: Path) -> None:
    diff = tmp_path / "fix.diff"
    diff.write_text("x")
    text = MINIMAL + '[variants.baseline]\n[variants.other]\n[expect]\nbaseline = "collapse"\n'
    s = load_scenario(
        write(tmp_path, text),
        Overrides(cycles=5, tp=2, variants=("baseline", "patched"), patch=diff),
    )
    assert s.cycle.count == 5 and s.server.tensor_parallel_size == 2
    assert [v.name for v in s.variants] == ["baseline", "patched"]
    assert s.variants[1].patch == diff.resolve()


def test_patch_flag_adds_a_patched_variant_the_file_may_expect(tmp_path: Path) -> None:
    diff = tmp_path / "fix.diff"
    diff.write_text("x")
    text = MINIMAL + '[expect]\nbaseline = "collapse"\npatched = "recover"\n'
    s = load_scenario(write(tmp_path, text), Overrides(patch=diff))
    assert [(v.name, v.expected, v.patch) for v in s.variants] == [
        ("baseline", "collapse", None),
        ("patched", "recover", diff.resolve()),
    ]
    with pytest.raises(ScenarioError, match="expect.patched: no variant named"):
        load_scenario(write(tmp_path, text, "no-flag.toml"))  # without --patch there is no such variant


def test_model_paths_are_relative_to_the_scenario_file(tmp_path: Path) -> None:
    folder = tmp_path / "scenarios"
    (folder / "draft").mkdir(parents=True)
    (tmp_path / "models" / "target").mkdir(parents=True)
    text = MINIMAL.replace('model = "builtin:tiny-llama"', 'model = "../models/target"', 1).replace(
        'model = "builtin:tiny-llama"', 'model = "./draft"'
    )
    s = load_scenario(write(folder, text))
    assert s.server.model == str(tmp_path / "models" / "target")
    assert s.speculative["model"] == str(folder / "draft")
    hub = load_scenario(write(folder, MINIMAL.replace("builtin:tiny-llama", "Qwen/Qwen3-8B"), "hub.toml"))
    assert hub.server.model == "Qwen/Qwen3-8B" and hub.speculative["model"] == "Qwen/Qwen3-8B"


@pytest.mark.parametrize("key", ["server.model", "speculative.model"])
def test_a_model_path_that_names_no_folder_is_bad_input_not_a_question_for_the_hub(tmp_path: Path, key: str) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "file").write_text("not a model folder")
    for ref, phrase in (("./models/missing", "does not exist"), ("./models/file", "is not a folder")):
        if key == "server.model":
            text = MINIMAL.replace('model = "builtin:tiny-llama"', f'model = "{ref}"', 1)
        else:
            text = MINIMAL.replace(
                'method = "draft_model"\nmodel = "builtin:tiny-llama"', f'method = "draft_model"\nmodel = "{ref}"'
            )
        with pytest.raises(ScenarioError) as info:
            load_scenario(write(tmp_path, text))
        assert info.value.key == key and phrase in info.value.reason and "--online" not in str(info.value)


@pytest.mark.parametrize(("text", "key", "phrase"), BAD)
def test_bad_scenarios_name_file_and_key(tmp_path: Path, text: str, key: str, phrase: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}")
    assert phrase in message
    assert "\n" not in message


def test_not_utf8_prompts(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_bytes(b"\xff\xfe bad")
    with pytest.raises(ScenarioError, match="workload.prompts: prompts file is not UTF-8"):
        load_scenario(write(tmp_path, MINIMAL + '[workload]\nprompts = "p.txt"\n'))


def test_unknown_variant_override(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"--variant: no variant 'nope' \(have: baseline\)"):
        load_scenario(write(tmp_path, MINIMAL), Overrides(variants=("nope",)))


@pytest.mark.parametrize(("text", "phrase"), [(BAD[2][0], "workload.max_tokens"), (BAD[14][0], "server.args")])
def test_cli_bad_scenario_exits_2_with_one_line(tmp_path: Path, text: str, phrase: str) -> None:
    path = write(tmp_path, text)
    result = CliRunner().invoke(app, ["run", str(path), "--output", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert phrase in result.output and str(path) in result.output
    assert not (tmp_path / "out").exists()  # nothing launched, nothing written


def test_cli_missing_scenario_and_bad_flags(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["run", str(tmp_path / "none.toml")])
    assert missing.exit_code == 2 and "scenario file not found" in missing.output
    zero = runner.invoke(app, ["run", str(write(tmp_path, MINIMAL)), "--cycles", "0"])
    assert zero.exit_code == 2
    nopatch = runner.invoke(app, ["run", str(write(tmp_path, MINIMAL)), "--patch", str(tmp_path / "x.diff")])
    scenario = write(tmp_path, MINIMAL)
    assert nopatch.exit_code == 2
    assert nopatch.output.strip() == f"error: {scenario}: --patch: patch file not found: {tmp_path / 'x.diff'}"
    for command in (["run", "--output", str(tmp_path / "out")], ["check"]):  # named with the scenario, as any patch
        folder = runner.invoke(app, [*command, str(scenario), "--patch", str(tmp_path)])
        assert folder.exit_code == 2, folder.output
        assert folder.output.strip() == f"error: {scenario}: --patch: a folder, not a patch file: {tmp_path}"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("3", "cycle.level: Input should be 1 or 2 (or a list of them)"),
        ("[1, 3]", "cycle.level: item 2: Input should be 1 or 2"),
    ],
)
def test_a_value_no_member_of_a_union_takes_is_one_reason(tmp_path: Path, value: str, reason: str) -> None:
    """`level` is 1, 2 or a list of them: a bad one is one line with the allowed values, not a reason per member
    (pydantic's "Input should be a valid list" beside "Input should be 1 or 2")."""
    file = write(tmp_path, MINIMAL + f"[cycle]\nlevel = {value}\n")
    shown = CliRunner().invoke(app, ["run", str(file), "--output", str(tmp_path / "out")])
    assert shown.exit_code == 2 and shown.output.strip() == f"error: {file}: {reason}", shown.output


def test_a_scenario_given_twice_is_one_line_saying_so(tmp_path: Path) -> None:
    file = write(tmp_path, MINIMAL)
    for command in (["run", "--output", str(tmp_path / "out")], ["check"]):
        shown = CliRunner().invoke(app, [*command, str(file), str(tmp_path / "." / file.name)])
        assert shown.exit_code == 2, shown.output
        assert shown.output.strip() == f"error: {file}: given twice; name each scenario file once"


def test_a_level_list_runs_every_variant_at_each_level(tmp_path: Path) -> None:
    text = MINIMAL + "[cycle]\nlevel = [1, 2]\n[variants.baseline]\n[variants.patched]\n"
    text += "[expect]\nbaseline = 'collapse'\nbaseline-L1 = 'recover'\npatched = 'recover'\n"
    s = load_scenario(write(tmp_path, text))
    assert [(v.name, v.level, v.expected) for v in s.variants] == [
        ("baseline-L1", 1, "recover"),
        ("baseline-L2", 2, "collapse"),
        ("patched-L1", 1, "recover"),
        ("patched-L2", 2, "recover"),
    ]
    assert s.settings()["variants"]["baseline-L1"]["level"] == 1


def test_push_keys_resolve_per_variant(tmp_path: Path) -> None:
    text = MINIMAL + "[cycle]\nreload = 'push'\npush_to = ['target']\n[variants.a]\n[variants.b]\n"
    text += "push_to = ['target', 'draft']\npush_scale = { 'model.x.weight' = 2.0 }\n"
    a, b = load_scenario(write(tmp_path, text)).variants
    assert a.push_to == ("target",) and a.push_scale == ()
    assert b.push_to == ("target", "draft") and b.push_scale == (("model.x.weight", 2.0),)


def test_a_sync_may_be_perturbed_and_partial_per_model(tmp_path: Path) -> None:
    text = MINIMAL + "[cycle]\nreload = 'weight_transfer'\npush_to = ['target', 'draft']\n[variants.off]\n"
    text += "push_scale = { 'draft:model.norm.weight' = 1.05 }\n"
    text += "push_skip = ['draft:model.layers.1.*', 'lm_head.weight']\n"
    s = load_scenario(write(tmp_path, text))
    (off,) = s.variants
    assert off.push_scale == (("draft:model.norm.weight", 1.05),)
    assert off.push_skip == ("draft:model.layers.1.*", "lm_head.weight")
    assert s.settings()["variants"]["off"]["push_skip"] == ["draft:model.layers.1.*", "lm_head.weight"]


def test_a_warmup_asks_for_16_tokens_unless_max_tokens_is_smaller_or_the_scenario_says(tmp_path: Path) -> None:
    assert load_scenario(write(tmp_path, MINIMAL)).workload.warmup_max_tokens == 16
    short = load_scenario(write(tmp_path, MINIMAL + "[workload]\nmax_tokens = 8\n", "short.toml"))
    assert short.workload.warmup_max_tokens == 8
    long = load_scenario(write(tmp_path, MINIMAL + "[workload]\nwarmup_tokens = 300\n", "long.toml"))
    assert long.workload.warmup_max_tokens == 300  # more than max_tokens (256) when asked


def test_min_repeats_defaults_to_two_or_repeats_and_may_not_exceed_repeats(tmp_path: Path) -> None:
    assert load_scenario(write(tmp_path, MINIMAL)).workload.least_repeats == 2
    one = load_scenario(write(tmp_path, MINIMAL + "[workload]\nrepeats = 1\n", "one.toml"))
    assert one.workload.least_repeats == 1  # the default never exceeds repeats
    five = load_scenario(write(tmp_path, MINIMAL + "[workload]\nmin_repeats = 5\n", "five.toml"))
    assert five.workload.least_repeats == 5 == five.workload.repeats
    over = write(tmp_path, MINIMAL + "[workload]\nrepeats = 3\nmin_repeats = 4\n", "over.toml")
    with pytest.raises(ScenarioError) as info:
        load_scenario(over)
    assert str(info.value) == f"{over}: workload.min_repeats: must be at most workload.repeats (3)"
    zero = write(tmp_path, MINIMAL + "[workload]\nmin_repeats = 0\n", "zero.toml")
    with pytest.raises(ScenarioError, match="workload.min_repeats: .*greater than or equal to 1"):
        load_scenario(zero)
    for argv in (["check", str(over)], ["run", str(over), "--output", str(tmp_path / "out")]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2, argv[0]
        assert f"{over}: workload.min_repeats: must be at most workload.repeats (3)" in result.output, argv[0]
    assert not (tmp_path / "out").exists()


def test_inexact_tensors_each_say_why_and_reach_the_fresh_fingerprint_only(tmp_path: Path) -> None:
    from specwake.run.measure.diagnose import fingerprint_kwargs

    named = '[cycle]\ninexact_tensors = { "model.layers.*.W_UK_T" = "another GEMM on this GPU" }\n'
    s = load_scenario(write(tmp_path, MINIMAL + named))
    assert s.cycle.inexact_tensors == {"model.layers.*.W_UK_T": "another GEMM on this GPU"}
    assert fingerprint_kwargs("after fresh", s.cycle.inexact_tensors)["inexact_tensors"] == s.cycle.inexact_tensors
    assert "inexact_tensors" not in fingerprint_kwargs("after reload", s.cycle.inexact_tensors)
    assert "inexact_tensors" not in fingerprint_kwargs("after fresh", {})
    with pytest.raises(ScenarioError, match=r"cycle\.inexact_tensors.*why a reload cannot reproduce it"):
        load_scenario(write(tmp_path, MINIMAL + '[cycle]\ninexact_tensors = { "lm_head.weight" = " " }\n', "b.toml"))


def test_the_variant_patch_adds_expects_recover_unless_the_file_or_expect_says_otherwise(tmp_path: Path) -> None:
    """A fix given with --patch to a scenario without a `patched` variant is tested to recover: a collapsing fix must
    not pass as `any`. The file's expect.patched, and over it --expect, say otherwise; each says where it came from."""
    diff = tmp_path / "fix.diff"
    diff.write_text("")  # read only when prepared

    def patched(text: str, **flags: str) -> tuple[str, str | None]:
        scenario = load_scenario(write(tmp_path, text), Overrides(patch=diff, **flags))
        (variant,) = [v for v in scenario.variants if v.name == "patched"]
        return variant.expected, variant.expected_from

    assert patched(MINIMAL) == ("recover", "--patch default")
    assert patched(MINIMAL, expect="collapse") == ("collapse", "--expect")
    assert patched(MINIMAL + "[expect]\npatched = 'crash'\n") == ("crash", None)  # the file's own word
    assert patched(MINIMAL + "[expect]\npatched = 'crash'\n", expect="any") == ("any", "--expect")
    own = MINIMAL + "[variants.baseline]\n[variants.patched]\n"  # a file's own `patched` keeps its file's default
    assert patched(own) == ("any", None)
    assert patched(own, expect="recover") == ("recover", "--expect")
    levels = load_scenario(write(tmp_path, MINIMAL + "[cycle]\nlevel = [1, 2]\n"), Overrides(patch=diff))
    assert [(v.name, v.expected_said) for v in levels.variants if v.name.startswith("patched")] == [
        ("patched-L1", "recover, --patch default"),
        ("patched-L2", "recover, --patch default"),
    ]
    plain = load_scenario(write(tmp_path, MINIMAL))  # no --patch: nothing added, nothing expected
    assert [(v.name, v.expected_said) for v in plain.variants] == [("baseline", "any")]


SPECULATIVE_ARGS = [  # (scenario text, its key): what vLLM's parser would read as a whole new --speculative-config
    (
        MINIMAL.replace(
            "[server]", "[server]\nargs = ['--seed', '0', '--speculative-config.num_speculative_tokens', '5']"
        ),
        "server.args",
    ),
    (MINIMAL.replace("[server]", "[server]\nargs = ['-sc.num_speculative_tokens', '5']"), "server.args"),
    (
        MINIMAL + "[variants.baseline]\n[variants.fix]\nargs = ['--speculative_config.num_speculative_tokens=5']\n",
        "variants.fix.args",
    ),
]


@pytest.mark.parametrize(("text", "key"), SPECULATIVE_ARGS)
def test_a_dotted_speculative_config_flag_is_refused_naming_the_key_to_set_under_speculative(
    tmp_path: Path, text: str, key: str
) -> None:
    """vLLM's parser gathers `--speculative-config.KEY VALUE` into a --speculative-config of its own, given after
    specwake's, which replaces the [speculative] table whole (FlexibleArgumentParser.parse_args)."""
    path = write(tmp_path, text)
    result = CliRunner().invoke(app, ["check", str(path), "--no-gpu-check"])
    assert result.exit_code == 2
    (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
    assert f"{path}: {key}: " in line and "set num_speculative_tokens under [speculative] instead" in line


@pytest.mark.parametrize("flag", ["-sc", "--speculative_config"])
def test_another_spelling_of_speculative_config_is_refused_as_the_flag_is(tmp_path: Path, flag: str) -> None:
    path = write(tmp_path, MINIMAL.replace("[server]", f"[server]\nargs = ['{flag}', '{{}}']"))
    with pytest.raises(ScenarioError, match=r"server\.args: .* is set by specwake \(use the \[speculative\] table\)"):
        load_scenario(path)
