"""Where the wall time of `specwake run scenarios/tiny-cpu.toml` goes: server startup, warmup, measurement,
cycle steps, diagnostics, teardown, and specwake's own overhead (everything else). Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_overhead.py [SCENARIO] [extra `specwake run` flags...]

Run it twice: the first run may build the tiny model and the overlay (cached afterwards).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    scenario = argv[0] if argv else "scenarios/tiny-cpu.toml"
    with tempfile.TemporaryDirectory() as out:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "specwake.cli", "run", scenario, "--output", out, "--quiet", *argv[1:]],
            cwd=REPO, capture_output=True, text=True,
        )  # fmt: skip
        wall = time.monotonic() - started
        results = list(Path(out).glob("*/result.json")) + list(Path(out).glob("*/*/result.json"))
        if not results:
            print(proc.stderr[-3000:])
            return 1
        totals: dict[str, float] = {}
        for path in results:
            for variant in json.loads(path.read_text())["variants"]:
                timings = variant.get("info", {}).get("timings", {})
                warmup = sum(stage.get("warmup_seconds", 0.0) for stage in variant["stages"])
                for key, value in timings.items():
                    totals[key] = totals.get(key, 0.0) + value
                totals["warmup"] = totals.get("warmup", 0.0) + warmup
                totals["measurement"] = totals.get("measurement", 0.0) - warmup
    accounted = sum(totals.values())
    print(f"scenario {scenario}: exit {proc.returncode}, wall {wall:.1f} s")
    for key in ("startup", "warmup", "measurement", "cycle_steps", "diagnostics", "teardown"):
        value = totals.get(key, 0.0)
        print(f"  {key:<12} {value:7.1f} s  {100 * value / wall:5.1f}%")
    overhead = wall - accounted
    print(f"  {'overhead':<12} {overhead:7.1f} s  {100 * overhead / wall:5.1f}%   (specwake itself: probe, overlay, "
          "planning, result writing, Python start)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
