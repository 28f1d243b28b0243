"""`specwake bisect`: which vLLM commit changed a variant's outcome, on one installed build, without a rebuild.

Each step overlays `git diff BASE..C -- vllm/` onto the installed vLLM (the same overlay a scenario's patch gets,
prepare/overlay.py: any file under vllm/, Python or package data) and runs the scenario's chosen variant, one cycle
unless told otherwise. BASE is the commit the installed build corresponds to: by default the commit a dev or nightly
build names in its version (`0.33.1.dev12+g0123abcd`), else the tag of its version. A commit whose diff from BASE
changes what the build compiles or generates (`build_input`: csrc/, CMakeLists.txt, setup.py, a .proto or C/CUDA
source under vllm/, …) cannot be run on the installed build's compiled parts, and one whose diff does not apply
cannot be run at all: both are skipped, as `git bisect skip` would, with the reason. Tests, docs, CI files and the
like change no installed file and are ignored, as vLLM's commits touch them.

Whether `--bad` must be skipped is seen in its diff alone, so it is decided before anything runs. A change to the
build stays in every later commit's diff from BASE, so the search then ends at the last commit before the first one
that changes the build (found by bisecting the diffs, no run), and says so; with none after `--good`, nothing runs.

Good and bad are decided by outcome: a commit is good when its outcome is the `--good` commit's (measured first),
or, with `--expect`, when it is that outcome. The search is a binary search over the first-parent-free list of
commits between good and bad (`git rev-list --ancestry-path`), so at most ⌈log2 N⌉ runs follow the two endpoints.
A `--good` that is not an ancestor of `--bad` (vLLM tags a release on its release branch) is replaced by their merge
base, and the bisect says so. The same search finds the commit that fixed a failure: `--good` older and failing,
`--bad` newer and passing.

A step's outcome is kept in specwake's cache (run/bisect/bisect_cache.py), keyed by what decides it — the installed
build, the diff overlaid, the scenario as the step runs it — and a later bisect that reaches a step of the same key
reuses it instead of running it again, and says so (`--remeasure`: run every step, and keep the new outcomes).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwake.errors import EXIT_FAIL, EXIT_INFRA, EXIT_PASS, InputError, PatchError
from specwake.events import Event, Events
from specwake.files import write_atomic
from specwake.judge.expectations import unknown_outcome
from specwake.judge.verdict import NOT_TESTED
from specwake.prepare.engine import install_stamp, probe_engine, resolve_python
from specwake.prepare.models import cache_dir
from specwake.prepare.releases import ByRelease
from specwake.prepare.scenario import Overrides, load_scenario
from specwake.run.bisect.bisect_cache import Measured, keep, recall, step_key
from specwake.run.bisect.vllm_git import (
    PLAIN,
    UNDER_VLLM,
    Ref,
    changes_the_build,
    find_base,
    foreign,
    git,
    merge_base,
    range_start,
    resolve,
)
from specwake.run.session.session import RunRequest, execute

BISECT_FILE = "bisect.json"


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    date: str  # author date, ISO 8601

    @property
    def short(self) -> str:
        return self.sha[:10]


@dataclass
class Step:
    commit: Commit
    verdict: str  # good | bad | skip
    outcome: str | None = None
    al_fresh: float | None = None
    al_after: list[float | None] = field(default_factory=list)
    seconds: float = 0.0  # the run's, in this bisect: 0 for a reused outcome
    reason: str = ""  # why skipped, or what decided it
    reused: str = ""  # the run folder of an earlier bisect's step whose outcome this one reuses (not run again)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "commit": dataclasses.asdict(self.commit)}


@dataclass(frozen=True)
class BisectRequest:
    scenario: Path
    repo: Path
    good: str
    bad: str
    output: Path
    base: str | None = None
    variant: str | None = None
    expect: str | None = None
    cycles: int = 1
    remeasure: bool = False  # run every step, even one whose outcome an earlier bisect kept (and keep the new one)


@dataclass
class BisectOutcome:
    root: Path
    steps: list[Step]
    exit_code: int
    found: Commit | None = None
    word: str = "first bad"  # first bad | first fixed
    files: list[str] = field(default_factory=list)
    candidates: list[Commit] = field(default_factory=list)  # when only skipped commits remain
    message: str = ""
    note: str = ""  # how the range was chosen, when --good was replaced by a merge base

    @property
    def file(self) -> Path:
        """bisect.json, in the bisect's folder."""
        return self.root / BISECT_FILE


class Bisect:
    """One bisect: the commits, the steps run so far, and how each commit is judged."""

    def __init__(self, request: BisectRequest, events: Events) -> None:
        self.request, self.events = request, events
        repo = request.repo
        git(repo, "rev-parse", "--git-dir")  # not a git checkout: InputError with git's own message
        self.scenario = load_scenario(request.scenario, Overrides(cycles=request.cycles))
        self.variant = self._variant(request.variant)
        good = Ref(request.good, resolve(repo, request.good, "--good"))
        self.bad = resolve(repo, request.bad, "--bad")
        problem = unknown_outcome("--expect", request.expect)
        if problem:
            raise InputError(problem)
        self.good_given = good.sha
        self.good, self.good_note = range_start(good, Ref(request.bad, self.bad), merge_base(repo, good.sha, self.bad))
        shas = git(repo, "rev-list", "--reverse", "--ancestry-path", f"{self.good}..{self.bad}").split()
        self.commits = [self._commit(sha) for sha in shas]  # after good, up to and including bad
        self.base = self._base(request.base)
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        self.root = request.output / f"{stamp}-bisect-{self.scenario.name}"
        for n in range(2, 1000):  # a second bisect within the same second (every step reused) gets a folder of its own
            if not self.root.exists():
                break
            self.root = request.output / f"{stamp}-bisect-{self.scenario.name}-{n}"
        self.steps: list[Step] = []
        self.good_outcome: str | None = request.expect

    def _variant(self, name: str | None) -> str:
        names = [v.name for v in self.scenario.variants]
        chosen = name or ("baseline" if "baseline" in names else names[0])
        if chosen not in names:
            raise InputError(f"--variant {chosen}: {self.scenario.file} has {', '.join(names)}")
        variant = next(v for v in self.scenario.variants if v.name == chosen)
        if variant.patches is not None:
            raise InputError(
                f"--variant {chosen}: it has a patch of its own ({variant.patches.values()[0]}); bisect overlays each"
                " commit's diff onto the installed vLLM, so choose a variant without one"
            )
        return chosen

    def _commit(self, sha: str) -> Commit:
        subject, date = git(self.request.repo, "show", "-s", "--format=%s%n%aI", sha).splitlines()[:2]
        return Commit(sha, subject, date)

    def _base(self, base: str | None) -> str:
        if base is not None:
            return resolve(self.request.repo, base, "--base")
        variant = next(v for v in self.scenario.variants if v.name == self.variant)
        version = probe_engine(resolve_python(variant.python), cache_dir()).vllm_version
        return find_base(self.request.repo, version)

    # ------------------------------------------------------------------ one step

    @functools.cached_property
    def build(self) -> str | None:
        """The installed build the steps overlay (engine.install_stamp of the variant's interpreter); None when it
        cannot be read, and then no outcome is kept or reused."""
        variant = next(v for v in self.scenario.variants if v.name == self.variant)
        return install_stamp(resolve_python(variant.python))

    def step(self, commit: Commit) -> Step:
        """Overlay the commit's diff of vllm/ from BASE, run the variant, judge the outcome (or skip); an outcome an
        earlier bisect kept for the same build, diff and scenario is reused, not run again (unless --remeasure)."""
        built, diff = self.changes(commit)
        if built:
            return self._skipped(commit, changes_the_build(built))
        key = step_key(self.scenario, self.variant, diff, self.build) if self.build is not None else None
        earlier = recall(cache_dir(), key) if key is not None and not self.request.remeasure else None
        if earlier is not None:
            step = self._judged(commit, earlier, reused=True)
            self.steps.append(step)
            return step
        folder = self.root / "steps" / commit.short
        patch: Path | None = None
        if diff.strip():
            patch = folder / "vllm.diff"
            write_atomic(patch, diff)
        variant = next(v for v in self.scenario.variants if v.name == self.variant)
        scenario = dataclasses.replace(
            self.scenario,
            variants=(
                dataclasses.replace(
                    variant, patches=ByRelease.plain(patch) if patch else None, expects=ByRelease.plain("any")
                ),
            ),
        )
        started = time.monotonic()
        request = RunRequest(
            scenarios=[self.request.scenario], overrides=Overrides(), output=folder, cache=cache_dir(),
            sequential=True, loaded=(scenario,),
        )  # fmt: skip
        try:
            result = execute(request, lambda event: None).results[0].variants[0]
        except PatchError as exc:
            return self._skipped(commit, f"its diff does not apply to the installed vLLM: {exc}")
        if result.outcome in NOT_TESTED:  # nothing measured (a lost port, a run stopped): no evidence either way
            return self._skipped(commit, f"not tested: outcome {result.outcome} ({result.error or 'no error text'})")
        fresh = result.fresh
        measured = Measured(
            result.outcome, fresh.acceptance_length if fresh else None,
            tuple(s.acceptance_length for s in result.stages_by_cycle if s.cycle > 0),
            round(time.monotonic() - started, 1), commit.sha, str(folder),
            dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        )  # fmt: skip
        if key is not None:
            keep(cache_dir(), key, measured)
        step = self._judged(commit, measured, reused=False)
        self.steps.append(step)
        return step

    def changes(self, commit: Commit) -> tuple[list[str], str]:
        """The commit's changes from BASE: the files among them that change the installed build (`built`), and the
        diff of vllm/ the overlay applies."""
        diff = git(
            self.request.repo, "diff", *PLAIN, "--binary", "--src-prefix=a/", "--dst-prefix=b/", self.base,
            commit.sha, "--", UNDER_VLLM,
        )  # fmt: skip
        return self.built(commit), diff

    def built(self, commit: Commit) -> list[str]:
        """The files of the commit's changes from BASE that change the installed build (`foreign`): from `git diff`
        alone, no run. Renames count as a delete and an add, so both paths are judged."""
        changed = git(self.request.repo, "diff", *PLAIN, "--name-only", "-z", self.base, commit.sha).split("\0")
        return foreign([p for p in changed if p])

    def last_runnable(self, end: int) -> int:
        """The index of the last commit before the first one, up to `end` (which changes the build), whose diff from
        BASE changes nothing of the build; -1 when the first commit after good already does. A bisection of the
        diffs: a change to the build stays in every later diff from BASE, unless a later commit reverts it."""
        lo, hi = -1, end
        while hi - lo > 1:
            middle = (lo + hi) // 2
            if self.built(self.commits[middle]):
                hi = middle
            else:
                lo = middle
        return lo

    def _skipped(self, commit: Commit, reason: str) -> Step:
        step = Step(commit, "skip", reason=reason)
        self.steps.append(step)
        self.events(Event(f"skip {commit.short} {commit.subject}: {reason}"))
        return step

    def _judged(self, commit: Commit, measured: Measured, reused: bool) -> Step:
        if self.good_outcome is None:
            self.good_outcome = measured.outcome  # the --good commit, measured first
        verdict = "good" if measured.outcome == self.good_outcome else "bad"
        return Step(
            commit, verdict, measured.outcome, measured.al_fresh, list(measured.al_after),
            0.0 if reused else measured.seconds,
            f"outcome {measured.outcome}" + ("" if verdict == "good" else f", not {self.good_outcome}"),
            measured.folder if reused else "",
        )  # fmt: skip


def run_bisect(request: BisectRequest, events: Events) -> BisectOutcome:
    """The whole bisect (see the module docstring); raises InputError (exit 2) before any run on bad input."""
    b = Bisect(request, events)
    say = events
    good_commit = b._commit(b.good)
    good = f"--good {request.good}" + (f" (merge base {b.good[:10]})" if b.good_note else "")
    if b.good_note:
        say(Event(b.good_note))
    good_built = b.built(good_commit)
    if good_built:
        raise InputError(f"{good}: cannot be run ({changes_the_build(good_built)})")
    end = _bad_end(b, request.bad, good)  # what the search takes as bad: --bad, or the last commit it can run
    if isinstance(end, BisectOutcome):
        return end
    n = end + 1
    bound = math.ceil(math.log2(n)) + 2 if n > 1 else 2
    say(Event(f"bisecting {n} commit(s) of {request.repo} on {b.scenario.name}/{b.variant}, base {b.base[:10]};"
              f" at most {bound} runs"))  # fmt: skip
    judged = 0  # steps with an outcome, run or reused

    def measure(commit: Commit, label: str) -> Step:
        nonlocal judged
        say(Event(f"{label}: {commit.short} {commit.subject}"))
        step = b.step(commit)
        if step.verdict != "skip":
            judged += 1
            how = (
                f"reused: an earlier bisect measured this diff on this build in {step.reused}; not run again"
                " (--remeasure runs it)"
                if step.reused
                else f"in {step.seconds:.0f} s"
            )
            say(Event(f"{label}: {commit.short} → {step.outcome} ({step.verdict}) {how}"))
        return step

    first = measure(good_commit, "good endpoint")
    if first.verdict == "skip":
        raise InputError(f"{good}: cannot be run ({first.reason})")
    if first.verdict == "bad":  # only with --expect: the good commit does not do what is expected of good ones
        return _stop(b, f"{good} gives {first.outcome}, not the expected {request.expect}: nothing to bisect")
    cut = end < len(b.commits) - 1  # --bad changes the build: the search ends before the first commit that does
    last = measure(b.commits[end], "last runnable commit" if cut else "bad endpoint")
    if last.verdict == "good" and cut:
        tail = b.commits[end + 1 :]
        return _finish(b, BisectOutcome(b.root, b.steps, EXIT_INFRA, candidates=tail, message=(
            f"{b.commits[end].short} gives {last.outcome} as {good} does: the change, if --bad {request.bad} has"
            f" one, is one of {len(tail)} commit(s) that could not be run (skipped)"
        )))  # fmt: skip
    if last.verdict == "good":
        return _stop(
            b, f"--bad {request.bad} gives {last.outcome} as {good} does: the range holds no change of outcome"
        )
    word = "first fixed" if first.outcome not in ("recover",) and last.outcome == "recover" else "first bad"
    lo, hi = -1, end  # commits[lo] (or good) is good; commits[hi] is bad or, if skipped, assumed bad
    skipped: set[int] = {end} if last.verdict == "skip" else set()
    while True:
        pending = [i for i in range(lo + 1, hi) if i not in skipped]
        if not pending:
            break
        middle = (lo + hi) // 2
        i = min(pending, key=lambda k: (abs(k - middle), k))  # the middle, or its nearest runnable neighbour
        left = f"{hi - lo - 1} commit(s) left between {_name(b, lo)} and {_name(b, hi)}"
        say(Event(f"step {judged + 1}/{bound}: {left}"))
        step = measure(b.commits[i], f"step {judged + 1}")
        if step.verdict == "skip":
            skipped.add(i)
        elif step.verdict == "good":
            lo = i
        else:
            hi = i
    if hi in skipped or any(i in skipped for i in range(lo + 1, hi)):
        candidates = [b.commits[i] for i in range(lo + 1, hi + 1)]
        measured_bad = hi not in skipped
        if not measured_bad or len(candidates) > 1:
            return _finish(
                b,
                BisectOutcome(
                    b.root,
                    b.steps,
                    EXIT_INFRA,
                    word=word,
                    candidates=candidates,
                    message=(f"the {word} commit is one of {len(candidates)} that could not be run (skipped)"),
                ),
            )
    found = b.commits[hi]
    files = git(request.repo, "show", "--name-only", "--format=", found.sha, "--", "vllm/").split()
    return _finish(b, BisectOutcome(b.root, b.steps, EXIT_PASS, found=found, word=word, files=files))


def _bad_end(b: Bisect, bad: str, good: str) -> int | BisectOutcome:
    """The index of the commit the search takes as bad, decided from `git diff` alone before anything runs: --bad
    itself, or, when its diff from BASE changes the build, the last commit before the first one that does (skipping
    --bad, and saying so). With no such commit after good, the finished bisect (exit 3): nothing can be run."""
    last = len(b.commits) - 1
    built = b.built(b.commits[last])
    if not built:
        return last
    b._skipped(b.commits[last], changes_the_build(built))
    end = b.last_runnable(last)
    tail = b.commits[end + 1 :]
    first = f"{tail[0].short} {tail[0].subject}"
    if end < 0:
        return _finish(b, BisectOutcome(b.root, b.steps, EXIT_INFRA, candidates=tail, message=(
            f"every commit after {good} changes the installed build from BASE, from {first} on: the change, if --bad"
            f" {bad} has one, is one of {len(tail)} commit(s) that could not be run (skipped)"
        )))  # fmt: skip
    b.events(Event(
        f"--bad {bad} cannot be run: bisecting up to {b.commits[end].short}, the last commit before {first}, the"
        " first whose diff from BASE changes the installed build"
    ))  # fmt: skip
    return end


def _stop(b: Bisect, message: str) -> BisectOutcome:
    """A bisect with nothing to search (exit 1): the endpoints do not differ as asked."""
    return _finish(b, BisectOutcome(b.root, b.steps, EXIT_FAIL, message=message))


def _name(b: Bisect, index: int) -> str:
    return "good" if index < 0 else b.commits[index].short


FIX_WORDS = {"good": "unfixed", "bad": "fixed"}  # a search for the commit that fixed a failure swaps the words


def _finish(b: Bisect, outcome: BisectOutcome) -> BisectOutcome:
    """Write bisect.json into the bisect's folder."""
    outcome.note = b.good_note
    if outcome.word == "first fixed":
        for step in outcome.steps:
            step.verdict = FIX_WORDS.get(step.verdict, step.verdict)
    data = {
        "scenario": str(b.scenario.file),
        "variant": b.variant,
        "repo": str(b.request.repo),
        "base": b.base,
        "good": b.good,
        "good_given": b.good_given,  # differs from good when --good is not an ancestor of --bad (their merge base)
        "bad": b.bad,
        "expect": b.request.expect,
        "commits": len(b.commits),
        "steps": [s.to_dict() for s in outcome.steps],
        "runs": sum(1 for s in outcome.steps if s.verdict != "skip" and not s.reused),
        "reused": [s.commit.sha for s in outcome.steps if s.reused],  # outcomes an earlier bisect measured
        "result": {
            "word": outcome.word,
            "commit": dataclasses.asdict(outcome.found) if outcome.found else None,
            "files": outcome.files,
            "candidates": [dataclasses.asdict(c) for c in outcome.candidates],
            "message": outcome.message,
            "exit_code": outcome.exit_code,
        },
    }
    write_atomic(outcome.file, json.dumps(data, indent=2) + "\n")
    return outcome
