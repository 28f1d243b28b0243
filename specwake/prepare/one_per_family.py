"""The weekly job's scenarios: of the scenario files given, one GPU scenario per drafter family that one machine of
N GPUs can hold, chosen from the files' own settings, so that the job's list cannot drift from the scenarios.

`python -m specwake.prepare.one_per_family --gpu-count N FILE...` prints the chosen files, one a line, as given (for
`specwake run $(...)`), and on stderr why each other file was left out. A file that is no valid scenario: its one
line, exit 2, nothing printed on stdout.

- A GPU scenario is one whose L2 discard is vLLM's real sleep mode (`cycle.discard = "native"`).
- Its family is its `cpu_scenario`, the CPU scenario of the same drafter family; one naming none is a family alone.
- It needs tensor_parallel_size × data_parallel_size GPUs, every rank of every engine; one that spans several
  machines (`server.nodes`) fits no single one.
- Within a family the pick is a scenario whose expectations can fail (one expecting `any` of every variant fails on
  nothing), then the one needing the fewest GPUs, then the first file name.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from specwake.errors import InputError
from specwake.prepare.scenario import Scenario, load_scenario


def gpus_needed(scenario: Scenario) -> int:
    """The GPUs a variant of `scenario` takes: one per rank of every engine."""
    return scenario.server.tensor_parallel_size * scenario.server.data_parallel_size


def family(scenario: Scenario) -> str:
    """The drafter family: its CPU scenario's file, or the scenario's own name where it names none."""
    return str(scenario.cpu_scenario) if scenario.cpu_scenario is not None else scenario.name


def _shown_family(scenario: Scenario) -> str:
    """The family as a message names it: the CPU scenario from the scenario's folder."""
    cpu = scenario.cpu_scenario
    return os.path.relpath(cpu, scenario.file.parent) if cpu is not None else scenario.name


def can_fail(scenario: Scenario) -> bool:
    """Whether some speculating variant expects anything but `any`, on some release."""
    return any(v.speculative and set(v.expects.values()) != {"any"} for v in scenario.variants)


def unfit(scenario: Scenario, gpu_count: int) -> str | None:
    """Why `scenario` cannot run on one machine of `gpu_count` GPUs, or None where it can."""
    if scenario.cycle.discard != "native":
        return f"not a GPU scenario (cycle.discard = {scenario.cycle.discard!r})"
    if scenario.server.nodes > 1:
        return f"spans {scenario.server.nodes} machines (server.nodes)"
    needed = gpus_needed(scenario)
    if needed > gpu_count:
        return f"needs {needed} GPUs, more than the {gpu_count} of this machine"
    return None


@dataclass(frozen=True)
class Pick:
    """The scenarios chosen, in the order given, and each other one with why it was left out."""

    chosen: tuple[Scenario, ...]
    left_out: tuple[tuple[Scenario, str], ...]


def one_per_family(scenarios: Sequence[Scenario], gpu_count: int) -> Pick:
    """Of `scenarios`, one GPU scenario per family that a machine of `gpu_count` GPUs holds (the module says which)."""
    left_out = [(s, why) for s in scenarios if (why := unfit(s, gpu_count))]
    fitting = [s for s in scenarios if not unfit(s, gpu_count)]
    best: dict[str, Scenario] = {}
    for scenario in sorted(fitting, key=lambda s: (not can_fail(s), gpus_needed(s), s.file.name)):
        best.setdefault(family(scenario), scenario)
    for scenario in fitting:
        chosen = best[family(scenario)]
        if chosen is not scenario:
            left_out.append((scenario, f"its family ({_shown_family(scenario)}) runs as {chosen.name}"))
    order = {id(s): i for i, s in enumerate(scenarios)}
    return Pick(
        chosen=tuple(s for s in scenarios if best.get(family(s)) is s),
        left_out=tuple(sorted(left_out, key=lambda item: order[id(item[0])])),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwake.prepare.one_per_family", description=__doc__)
    parser.add_argument("--gpu-count", type=int, required=True, help="GPUs of the machine the scenarios run on")
    parser.add_argument("files", nargs="+", help="scenario files")
    args = parser.parse_args(argv)
    if args.gpu_count < 1:
        print(f"--gpu-count: {args.gpu_count} is no count of GPUs (1 or more)", file=sys.stderr)
        return 2
    try:
        scenarios = [load_scenario(path) for path in args.files]
    except InputError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    given = {id(s): path for s, path in zip(scenarios, args.files, strict=True)}
    pick = one_per_family(scenarios, args.gpu_count)
    for scenario, why in pick.left_out:
        print(f"{given[id(scenario)]}: left out: {why}", file=sys.stderr)
    for scenario in pick.chosen:
        print(given[id(scenario)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
