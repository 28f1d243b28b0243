"""GPU memory before launch (specwake/prepare/memory.py): weights per GPU from planted safetensors headers and the
scenario's layout, what each vLLM release claims of a GPU, and the rule that refuses a layout that cannot fit, with
DeepSeek-V3 DP 8 + EP laid out from its real shapes refused on 8 × 80 GB and held on 8 × 141 GB."""

from __future__ import annotations

import json
from pathlib import Path

from specwake.prepare.engine import EngineInfo, GpuMemory
from specwake.prepare.memory import (
    DEFAULT_UTILIZATION,
    GIB,
    Claim,
    Estimate,
    Weights,
    estimate,
    gib,
    judge,
    misfit,
    read_weights,
    vllm_claim,
)
from specwake.prepare.plan import executors_asked, flag_values
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant
from tests.helpers.checkpoints import ELEMENT, deepseek_v3, write_header
from tests.helpers.paths import REPO

EXPERT = {f"model.layers.0.mlp.experts.{e}.{w}.weight": ("F8_E4M3", [16, 8]) for e in range(4) for w in ("up", "down")}
DENSE = {
    "model.embed_tokens.weight": ("BF16", [10, 8]),
    "model.layers.0.mlp.shared_experts.up.weight": ("BF16", [16, 8]),  # shared, not routed: not an expert
    "model.layers.0.mlp.gate.e_score_correction_bias": ("F32", [4]),
}


def numel(shape: list[int]) -> int:
    return shape[0] * (shape[1] if len(shape) > 1 else 1)


def planted(folder: Path) -> Path:
    write_header(folder / "model-00001-of-00002.safetensors", EXPERT)
    write_header(folder / "model-00002-of-00002.safetensors", DENSE)
    return folder


def cuda(version: str) -> EngineInfo:
    return EngineInfo("/py", "3.12", version, Path("/pkg/vllm"), (), "cuda", True, None, 8, 16)


MTP = 'method = "mtp"\nnum_speculative_tokens = 1'


def scenario(tmp_path: Path, server: str = "", speculative: str = MTP) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(f'[server]\nmodel = "m"\n{server}\n[speculative]\n{speculative}\n[variants.baseline]\n')
    return load_scenario(path)


def prepared(s: Scenario, model: Path, version: str = "0.33.0", draft: str | None = None) -> PreparedVariant:
    return PreparedVariant(s.variants[0], cuda(version), None, None, str(model), draft, "native")


def test_weights_come_from_the_headers_routed_experts_apart_floating_point_at_the_models_dtype(tmp_path: Path) -> None:
    folder = planted(tmp_path / "m")
    experts = sum(numel(shape) * ELEMENT[dtype] for dtype, shape in EXPERT.values())  # FP8: as stored
    for element in (2, 4):  # bfloat16 and float32 alike become the model's dtype
        other = sum(numel(shape) * element for _, shape in DENSE.values())
        assert read_weights(str(folder), element) == Weights(experts, other)
    other_16 = sum(numel(shape) * 2 for _, shape in DENSE.values())
    assert "not on this machine" in str(read_weights(str(tmp_path / "absent"), 2))
    # a consolidated copy beside the sharded files: vLLM reads only the files the index names
    write_header(folder / "consolidated.safetensors", {**EXPERT, **DENSE})
    assert read_weights(str(folder), 2) != Weights(experts, other_16)
    files = {"model-00001-of-00002.safetensors": EXPERT, "model-00002-of-00002.safetensors": DENSE}
    shards = {name: file for file, names in files.items() for name in names}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    assert read_weights(str(folder), 2) == Weights(experts, other_16)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.safetensors").write_bytes(b"\x01")
    assert "too short" in str(read_weights(str(tmp_path / "junk"), 2))


def test_experts_spread_over_tp_times_dp_with_expert_parallelism_the_rest_over_tp_and_a_drafter_adds(
    tmp_path: Path,
) -> None:
    w = read_weights(str(planted(tmp_path / "m")), 2)
    assert isinstance(w, Weights)
    ep = scenario(tmp_path, "tensor_parallel_size = 2\ndata_parallel_size = 4\nenable_expert_parallel = true")
    found = estimate(ep, prepared(ep, tmp_path / "m"))
    assert isinstance(found, Estimate)
    assert found.weights == -(-w.other // 2) + -(-w.experts // 8)
    assert "over 8 ranks, the rest over TP 2" in found.how and "server.data_parallel_size" in found.spread_by
    dense = scenario(tmp_path, "tensor_parallel_size = 2\ndata_parallel_size = 4")  # no EP: every engine a copy
    assert getattr(estimate(dense, prepared(dense, tmp_path / "m")), "weights", None) == -(-(w.other + w.experts) // 2)
    own = 'method = "draft_model"\nmodel = "d"\nnum_speculative_tokens = 3'
    drafted = scenario(tmp_path, 'dtype = "float32"', own)
    write_header(tmp_path / "d" / "model.safetensors", DENSE)
    wide = read_weights(str(planted(tmp_path / "m")), 4)
    assert isinstance(wide, Weights)
    both = estimate(drafted, prepared(drafted, tmp_path / "m", draft=str(tmp_path / "d")))
    assert getattr(both, "weights", None) == wide.experts + wide.other + sum(numel(s) * 4 for _, s in DENSE.values())
    gone = estimate(drafted, prepared(drafted, tmp_path / "m", draft=str(tmp_path / "none")))
    assert isinstance(gone, str) and gone.startswith("drafter ") and "not on this machine" in gone


def test_what_each_release_claims_of_a_gpu_and_whether_it_refuses_a_gpu_with_less_free() -> None:
    assert vllm_claim("0.33.0", []) == Claim(DEFAULT_UTILIZATION, "vLLM 0.33.0's default 0.92", True)
    assert vllm_claim("0.34.0", []) == Claim(1.0, "vLLM 0.34.0's default 1 (extensible KV cache)", False)
    off = vllm_claim("0.34.0", ["--no-enable-extensible-kv-cache"])
    assert isinstance(off, Claim) and (off.fraction, off.checks_free) == (DEFAULT_UTILIZATION, True)
    asked = vllm_claim("0.34.0", ["--gpu-memory-utilization", "0.5", "--gpu-memory-utilization=0.7"])
    assert asked == Claim(0.7, "gpu_memory_utilization 0.7", False)  # the last one, as vLLM's parser keeps
    assert "--kv-cache-memory-bytes" in str(vllm_claim("0.33.0", ["--kv-cache-memory-bytes", "1000"]))
    assert "no number" in str(vllm_claim("0.33.0", ["--gpu-memory-utilization", "most"]))


def test_a_flags_values_in_either_spelling() -> None:
    args = ["--dtype", "half", "--seed", "0", "--dtype=float32", "--distributed-executor-backend=ray"]
    assert flag_values(args, "--dtype") == ["half", "float32"] and flag_values(args, "-q") == []
    assert executors_asked(args) == ["ray"]


def test_a_layout_that_cannot_fit_is_refused_naming_the_gpu_the_numbers_and_the_key_to_change() -> None:
    gpu = GpuMemory(3, free=70 * GIB, total=80 * GIB)
    claim = Claim(0.9, "gpu_memory_utilization 0.9", True)

    def est(weights_gib: float, c: Claim = claim) -> Estimate:
        return Estimate(int(weights_gib * GIB), "target", c, "server.tensor_parallel_size")

    too_big = misfit(est(72), gpu)  # 0.9 × 80 GiB = 72 GiB: the weights alone take it all
    assert too_big is not None and "72.00 GiB per GPU" in too_big and "of GPU 3" in too_big
    assert "server.tensor_parallel_size or raise server.gpu_memory_utilization" in too_big
    claim_free = misfit(est(60), gpu)  # fits the claim and the free memory, but vLLM wants its claim free
    assert claim_free is not None and "70.00 GiB free of 80.00 GiB" in claim_free
    assert "server.gpu_memory_utilization to 0.87 or less" in claim_free and "Free memory on device" in claim_free
    extensible = Claim(1.0, "vLLM 0.34.0's default 1 (extensible KV cache)", False)
    assert misfit(est(60, extensible), gpu) is None  # 0.34 takes what is free
    short = misfit(est(71, extensible), gpu)
    assert short is not None and "less than the weights' 71.00 GiB" in short and "--gpus" in short
    line, problem = judge(est(10), [GpuMemory(2, 76 * GIB, 80 * GIB), GpuMemory(4, 75 * GIB, 80 * GIB)])
    assert problem is None and line.endswith("of GPU 4 (gpu_memory_utilization 0.9 × 80.00 GiB); 75.00 GiB free there"
                                             " (the least of 2) — fits")  # fmt: skip
    line, problem = judge(est(10), [GpuMemory(2, 76 * GIB, 80 * GIB), gpu])
    assert problem == misfit(est(10), gpu) and line.endswith("of GPU 3 (gpu_memory_utilization 0.9 × 80.00 GiB);"
                                                             " 70.00 GiB free there — does not fit")  # fmt: skip
    line, problem = judge("target m: not on this machine", [gpu])
    assert (line, problem) == ("not estimated: target m: not on this machine", None)


def test_deepseek_v3_dp8_ep_is_refused_on_8x80gb_and_fits_on_8x141gb(tmp_path: Path) -> None:
    """The shipped scenario with DeepSeek-V3's checkpoint laid out from its shapes (tests/helpers/checkpoints.py):
    each engine holds the attention and dense layers whole and an eighth of the routed experts."""
    s = load_scenario(REPO / "scenarios" / "deepseek-v3-dp-ep.toml")
    model = deepseek_v3(tmp_path / "DeepSeek-V3")
    weights = read_weights(str(model), 2)
    assert isinstance(weights, Weights)
    assert 650e9 < weights.experts + weights.other < 720e9  # the scenario's "FP8 weights are ~690 GB"
    for version in ("0.33.0", "0.34.0"):
        found = estimate(s, prepared(s, model, version))
        assert isinstance(found, Estimate) and found.weights == weights.other + -(-weights.experts // 8)
        h100 = [GpuMemory(g, free=79 * 10**9, total=80 * 10**9) for g in range(8)]
        line, problem = judge(found, h100)
        assert problem is not None and f"its weights, {gib(found.weights)} per GPU" in problem
        assert "server.tensor_parallel_size or server.data_parallel_size (the experts)" in problem
        assert line.endswith("— does not fit") and "gpu_memory_utilization 0.9" in line
        assert f"    memory: {line}\n" in (REPO / "docs" / "how-it-works.md").read_text()  # the docs' example
        h200 = [GpuMemory(g, free=140 * 10**9, total=141 * 10**9) for g in range(8)]
        assert judge(found, h200)[1] is None
