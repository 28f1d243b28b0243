"""Benchmark of specwake.run.session.schedule's packing: makespan against the lower bound and GPU utilisation
for realistic job mixes on 8 GPUs, plus the time plan_schedule itself takes on a large mix."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Iterable, Sequence

from specwake.run.session.schedule import Assignment, Job, plan_schedule


def makespan(assignments: Iterable[Assignment]) -> float:
    """Seconds from the first start to the last end (0.0 for no assignments)."""
    items = list(assignments)
    return max(a.end for a in items) - min(a.start for a in items) if items else 0.0


def lower_bound(jobs: Sequence[Job], n_gpus: int) -> float:
    """No schedule can beat max(total GPU-seconds / n_gpus, longest job); CPU mode (0 GPUs): the sum."""
    if not jobs:
        return 0.0
    if n_gpus <= 0:
        return sum(job.est_seconds for job in jobs)
    gpu_seconds = sum(job.gpus_needed * job.est_seconds for job in jobs)
    return max(gpu_seconds / n_gpus, max(job.est_seconds for job in jobs))


def utilisation(assignments: Iterable[Assignment], n_gpus: int) -> float:
    """Busy GPU-seconds / (n_gpus x makespan), in [0, 1]; 0.0 when nothing ran or no GPUs."""
    items = list(assignments)
    span = makespan(items)
    if n_gpus <= 0 or span <= 0:
        return 0.0
    return sum(len(a.gpus) * (a.end - a.start) for a in items) / (n_gpus * span)


# The GPU scenarios in scenarios/ with their tensor parallel size and a rough wall time per variant
# (startup + fresh stage + 2 L2 cycles, 3 x 256-token requests per stage) on a 2-GPU slice.
GPU_SCENARIOS = {
    "qwen-mtp": (2, 900.0),  # 27B FP8: slowest load and reload
    "dspark": (2, 700.0),
    "eagle3-eager": (2, 600.0),
    "eagle3-graphed": (2, 450.0),  # CUDA-graph capture, then crashes after the first wake
    "gemma4-mtp": (2, 400.0),
    "tiny-gpu": (1, 300.0),  # builtin tiny pair: dominated by startup
}
VARIANTS = ("baseline", "patched")


def scenario_mix() -> list[Job]:
    return [Job(f"{name}/{v}", tp, est) for name, (tp, est) in GPU_SCENARIOS.items() for v in VARIANTS]


def scenario_mix_tp4() -> list[Job]:
    """The same nightly run with every large model at TP 4 (e.g. after an OOM at TP 2)."""
    return [Job(job.key, 4 if job.gpus_needed == 2 else 1, job.est_seconds * 0.7) for job in scenario_mix()]


def mixed_tp(rng: random.Random, count: int = 24) -> list[Job]:
    sizes = rng.choices([1, 2, 4, 8], weights=[4, 4, 2, 1], k=count)
    return [Job(f"mixed{i:02d}/{rng.choice(VARIANTS)}", tp, rng.uniform(120, 1800)) for i, tp in enumerate(sizes)]


def many_small(rng: random.Random, count: int = 64) -> list[Job]:
    return [Job(f"small{i:02d}/{VARIANTS[i % 2]}", 1, rng.uniform(30, 300)) for i in range(count)]


def row(name: str, jobs: Sequence[Job], gpus: Sequence[int]) -> str:
    plan = plan_schedule(jobs, gpus)
    span, bound = makespan(plan), lower_bound(jobs, len(gpus))
    serial = sum(job.est_seconds for job in jobs)
    return (
        f"{name:<24} {len(jobs):>5} {span:>10.0f} {bound:>10.0f} {span / bound:>7.3f} "
        f"{utilisation(plan, len(gpus)):>7.1%} {serial:>10.0f} {serial / span:>8.2f}x"
    )


def planning_speed(rng: random.Random, count: int, gpus: Sequence[int]) -> tuple[float, float]:
    jobs = mixed_tp(rng, count)
    started = time.perf_counter()
    plan = plan_schedule(jobs, gpus)
    return time.perf_counter() - started, makespan(plan) / lower_bound(jobs, len(gpus))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    gpus = list(range(args.gpus))
    header = f"{'mix':<24} {'jobs':>5} {'makespan':>10} {'lower bd':>10} {'ratio':>7} {'util':>7}"
    header += f" {'serial':>10} {'speedup':>9}"
    print(f"{args.gpus} GPUs, seed {args.seed}; seconds are estimates, ratio = makespan / lower bound")
    print(header)
    print("-" * len(header))
    print(row("gpu scenarios x2", scenario_mix(), gpus))
    print(row("gpu scenarios x2, TP4", scenario_mix_tp4(), gpus))
    print(row("mixed TP 1/2/4/8", mixed_tp(rng), gpus))
    print(row("many small (TP1)", many_small(rng), gpus))
    ratios = []
    for _ in range(200):
        jobs = mixed_tp(rng, rng.randint(4, 40))
        ratios.append(makespan(plan_schedule(jobs, gpus)) / lower_bound(jobs, len(gpus)))
    ratios.sort()
    print(f"200 random mixed-TP mixes: ratio median {ratios[100]:.3f}, p90 {ratios[180]:.3f}, worst {ratios[-1]:.3f}")
    for count in (100, 1000):
        seconds, ratio = planning_speed(rng, count, gpus)
        print(f"plan_schedule on {count} mixed jobs: {seconds * 1000:.1f} ms (ratio {ratio:.3f})")


if __name__ == "__main__":
    main()
