"""Result objects for tests: base builders of a stage, a variant and a scenario result, the two sample runs of the
report tests (`tiny_cpu`, `graphed_gpu`) and the checked-in sample result.json (`sample_result`).

Each builder fills every field with a plain value and takes any field by keyword (dataclasses.replace), so a
test names only what it is about. Changing a value here changes tests/data/golden-report.md: don't, unless on purpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from specwake.results import Diagnostic, ScenarioResult, StageResult, StepResult, VariantResult
from specwake.runfolder import load_result
from tests.helpers.paths import DATA

SAMPLE = DATA / "result-v1-sample.json"  # a result of schema v1, as an older specwake wrote it
PATCH_SHA = "3f2a9c1b0d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"
SCENARIO_SHA = "9a8b7c6d5e4f30211203a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5"


def stage(
    cycle: int,
    *,
    drafts: int = 100,
    accepted: int = 0,
    k: int = 3,
    tok_s: Sequence[float] = (10.0,),
    tokens: int = 32,
    output: str = "x",
    **fields: Any,
) -> StageResult:
    """The stage of `cycle` (0: fresh): `drafts` drafts of `k` tokens, `accepted` of them accepted (AL = 1 +
    accepted / drafts, None without drafts, the same rate at every position), one request per `tok_s` sample,
    each `tokens` long with text `output`, matching fresh after a cycle. Any other field by keyword."""
    samples = list(tok_s)
    base = StageResult(
        name="fresh" if cycle == 0 else f"after L2 #{cycle}",
        cycle=cycle,
        acceptance_length=1 + accepted / drafts if drafts else None,
        num_drafts=drafts,
        num_draft_tokens=drafts * k,
        num_accepted_tokens=accepted,
        per_position=[accepted / drafts / k] * k if drafts else [],
        tok_s=samples,
        tok_s_median=sorted(samples)[len(samples) // 2] if samples else None,
        completion_tokens=[tokens] * len(samples),
        outputs=[output] * len(samples),
        outputs_match_fresh=None if cycle == 0 else True,
    )
    return replace(base, **fields)


def variant(
    name: str = "baseline",
    outcome: str = "recover",
    expected: str = "any",
    stages: Sequence[StageResult] = (),
    **fields: Any,
) -> VariantResult:
    """A CPU variant on vLLM 0.32.0 with the emulated discard, no patch; `matched` follows outcome and expected
    (an error never matches). Any other field by keyword."""
    base = VariantResult(
        name=name,
        outcome=outcome,
        expected=expected,
        matched=outcome != "error" and expected in ("any", outcome),
        platform="cpu",
        l2_discard="emulated",
        vllm_version="0.32.0",
        vllm_file=None,
        python="/usr/bin/python3",
        patch=None,
        patch_sha256=None,
        overlay=None,
        command=[],
        env={},
        stages=list(stages),
    )
    return replace(base, **fields)


def scenario(name: str, verdict: str, variants: Sequence[VariantResult], **fields: Any) -> ScenarioResult:
    """A finished run of scenarios/<name>.toml (tiny-llama, draft_model k=3, 2 L2 cycles) on a CI runner."""
    base = ScenarioResult(
        scenario={
            "name": name,
            "file": f"scenarios/{name}.toml",
            "sha256": SCENARIO_SHA,
            "settings": {
                "server": {"model": "builtin:tiny-llama", "tensor_parallel_size": 1, "enforce_eager": True},
                "speculative": {"method": "draft_model", "num_speculative_tokens": 3},
                "workload": {"repeats": 3, "max_tokens": 64},
                "cycle": {"level": 2, "count": 2},
                "expect": {"tolerance": 0.05, "min_speedup_recovery": 0.9},
            },
            "mode": "sequential",
        },
        verdict=verdict,
        started_at="2025-06-01T12:00:00Z",
        finished_at="2025-06-01T12:04:10Z",
        host={"hostname": "ci-runner", "platform": "Linux-x86_64", "python": "3.11.7"},
        variants=list(variants),
        specwake_version="0.1.0",
    )
    return replace(base, **fields)


def sample_result() -> ScenarioResult:
    """tests/data/result-v1-sample.json, loaded as specwake loads any result (a fresh object each call)."""
    return load_result(SAMPLE)


# ------------------------------------------------------------ the report tests' two runs


def _fingerprint(draft_zero: int) -> list[dict]:
    draft = {"present": True, "tensors": 15, "all_zero": draft_zero, "on_meta": 0, "empty": 0}
    return [{"target": {"present": True, "tensors": 15, "all_zero": 0, "on_meta": 0}, "draft": draft}]


DIAGNOSTICS = [
    Diagnostic.from_dict({"cycle": 1, "point": "before sleep", "memory": [{"device": "cpu", "free_bytes": None}]}),
    Diagnostic.from_dict({"cycle": 1, "point": "after reload_weights", "fingerprints": _fingerprint(7)}),
]


def measured_stage(cycle: int, drafts: int, accepted: int, tok_s: list[float], match: bool | None) -> StageResult:
    """A stage as the report samples measure it: 64-token completions of the same text, k = 3."""
    return stage(
        cycle,
        drafts=drafts,
        accepted=accepted,
        tok_s=tok_s,
        tokens=64,
        output="The quick brown fox",
        outputs_match_fresh=match,
    )


def reported_variant(name: str, outcome: str, expected: str, stages: list[StageResult], **fields: Any) -> VariantResult:
    """A variant with everything the report's details show: interpreter, command, env, steps, timings, diagnostics."""
    details: dict[str, Any] = {
        "vllm_file": "/venv/lib/python3.11/site-packages/vllm/__init__.py",
        "python": "/venv/bin/python",
        "command": ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
        "env": {"VLLM_SERVER_DEV_MODE": "1"},
        "steps": [
            StepResult(1, "sleep", "POST", "/sleep?level=2", 200, 0.12, True, None, None),
            StepResult(1, "discard", "POST", "/collective_rpc", 200, 0.05, True, None, {"n": 2}),
        ],
        "info": {"device": "cpu", "gpus": [], "crash_lines": [], "timings": {"startup": 30.25, "measurement": 7.5}},
        "seconds": 61.5,
        "diagnostics": DIAGNOSTICS,
    }
    return variant(name, outcome, expected, stages, **(details | fields))


def woken(steps: Sequence[StepResult], reloads: Sequence[float]) -> list[StepResult]:
    """`steps`, then for each cycle (1, 2, …) its L2 wake: wake_weights and wake_kv_cache of 5 ms each around a
    reload_weights of the given seconds."""
    wakes = []
    for cycle, seconds in enumerate(reloads, 1):
        wakes += [
            StepResult(cycle, "wake_weights", "POST", "/wake_up?tags=weights", 200, 0.005, True),
            StepResult(cycle, "reload_weights", "POST", "/collective_rpc", 200, seconds, True),
            StepResult(cycle, "wake_kv_cache", "POST", "/wake_up?tags=kv_cache", 200, 0.005, True),
        ]
    return [*steps, *wakes]


def tiny_cpu() -> ScenarioResult:
    """A passing run: baseline collapses, patched recovers (both with the emulated discard)."""
    baseline = reported_variant(
        "baseline",
        "collapse",
        "collapse",
        [
            measured_stage(0, 64, 192, [41.25, 40.5, 42.0], None),
            measured_stage(1, 192, 0, [15.5, 15.25, 15.75], True),
            measured_stage(2, 192, 0, [15.0, 15.5, 15.25], True),
        ],
        model_runner="v2",
        first_load_seconds=2.75,
    )
    baseline = replace(baseline, steps=woken(baseline.steps, [0.015, 0.02]))
    patched = reported_variant(
        "patched",
        "recover",
        "recover",
        [
            measured_stage(0, 64, 192, [41.0, 40.75, 42.5], None),
            measured_stage(1, 64, 192, [40.25, 41.5, 40.0], True),
            measured_stage(2, 65, 190, [39.5, 40.0, 41.0], True),
        ],
        patch="patches/draft-reload.diff",
        patch_sha256=PATCH_SHA,
        overlay="/cache/specwake/overlays/3f2a9c1b",
        model_runner="v2",
        first_load_seconds=2.75,
    )
    patched = replace(patched, steps=woken(patched.steps, [0.048, 0.04]))
    return scenario("tiny-cpu", "pass", [baseline, patched])


def graphed_gpu() -> ScenarioResult:
    """A run with a crash after partial measurement, an unready server and awkward text."""
    crashed = reported_variant(
        "baseline",
        "crash",
        "crash",
        [measured_stage(0, 50, 110, [88.0], None)],
        platform="cuda",
        l2_discard="native",
        crash_class="step_failed",
        error="POST /wake_up?tags=kv_cache answered 500: <html> error page",
        log_path="results/run/logs/baseline.log",
        log_excerpt="RuntimeError: CUDA error: an illegal memory access\n```inner fence```",
        info={"gpus": [0, 1], "crash_lines": ["RuntimeError: CUDA error: an illegal memory access"]},
        diagnostics=[],
        model_runner="v1",
    )
    unready = reported_variant(
        "patched|v2",
        "error",
        "recover",
        [],
        platform="cuda",
        l2_discard="native",
        vllm_version=None,
        crash_class="startup_failed",
        error="server exited with code 1 before /health answered",
        log_excerpt="ImportError: cannot import name 'X'",
        patch_sha256=PATCH_SHA,
        info={"gpus": [2, 3], "crash_lines": [], "timings": {"startup": 12.0}},
        diagnostics=[],
    )
    return scenario("eagle3-graphed", "error", [crashed, unready])


def scaled(result: ScenarioResult, factor: float, discard: str = "native") -> ScenarioResult:
    """Every stage's tok/s of every variant times `factor` (with a 1 % wobble per stage), the L2 discard as given:
    runs of one scenario at another speed, for trend tests."""

    def fix(v: VariantResult) -> VariantResult:
        stages = [replace(st, tok_s=[x * factor * (1 + 0.01 * i) for x in st.tok_s]) for i, st in enumerate(v.stages)]
        return replace(v, stages=stages, l2_discard=discard)

    return replace(result, variants=[fix(v) for v in result.variants])


def dropped(result: ScenarioResult) -> ScenarioResult:
    """The patched variant's first post-cycle AL down from 4.00 to 3.00."""
    patched = next(v for v in result.variants if v.name == "patched")
    stages = [replace(s, acceptance_length=3.0) if s.cycle == 1 else s for s in patched.stages]
    variants = [replace(v, stages=stages) if v is patched else v for v in result.variants]
    return replace(result, variants=variants)
