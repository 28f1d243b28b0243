"""specwake's pytest plugin: scenario files collected as tests, one item per scenario × variant.

    pytest scenarios/cpu/eagle3.toml          # a file, or a folder of them; node ids read eagle3.toml::patched
    pytest                                    # with `specwake_scenarios = scenarios/cpu` in the ini file

A scenario runs once, when its first selected item runs (only the selected variants: `-k patched` starts one
server); each variant is then reported as its own item, its time its variant's own seconds (the first item does not
carry the whole run). An item passes when its variant met its expectation with no finding; its failure, headed
`VARIANT (FILE)`, is the variant's verdict line, why, and its stages. Each item records its figures as properties
(outcome, expected, AL fresh and after each cycle, tok/s ratio, wake seconds), which pytest's `--junitxml` and CI
collectors such as Buildkite's carry as they are. Markers come from the scenario: `cpu` or `gpu`, and the drafter
method (`eagle3`, `mtp`, `draft_model`, …). A scenario this machine cannot run is skipped with `run`'s reason; a bad
scenario file is a collection error naming its file and key. `-x` stops at the first failing item: the scenario has
run all its selected variants by then (their results are in its run folder), but the items after it are not
reported, and no further scenario starts.

Under pytest-xdist (`-n N`, any `--dist`) the workers take turns (`Turns`): one scenario runs at a time in the whole
session, as without xdist (two runs at once would share the GPUs and the cores, and disturb each other's timings),
and each scenario runs once; a worker given items of a scenario another worker ran reads that run's results. Under
`-x` each worker still runs the items xdist has already handed it, which may start further scenarios. Each run also
takes the machine's turn (specwake.run.session.machine_turn, in `execute`), so a session and a CLI run take turns too.

Registered through the `pytest11` entry point, the plugin does nothing unless scenario files are collected: a
`.toml` file is collected only when it was named on the command line (itself or a folder above it) or lies in a
folder of `specwake_scenarios`, and only when it is a scenario (a `[server]` table). A project that merely installs
specwake, or runs pytest on its default paths, sees no change.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from specwake.errors import InfraError, InputError, Interrupted, SpecwakeError
from specwake.events import Event
from specwake.files import write_atomic

if TYPE_CHECKING:
    from specwake.results import ScenarioResult, VariantResult

    Outcome = tuple[list[ScenarioResult], Path | None]  # a scenario's results and its run folder

INI_FOLDERS = "specwake_scenarios"
SPEED_RATIO_SHOWN = 0.9  # any threshold gives the same ratio; the property is the ratio, not the call
XDIST_FOLDER = "pytest-xdist"  # in specwake's cache: one folder per xdist session, shared by its workers
_TESTRUN = pytest.StashKey[str]()  # on xdist's controller: the session's test-run id, whose folder it removes


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specwake", "specwake scenario files as tests")
    group.addoption("--specwake-output", default="results", help="Results folder (as `specwake run --output`).")
    group.addoption("--specwake-patch", default=None, help="Diff for the `patched` variant (as `run --patch`).")
    group.addoption("--specwake-cycles", type=int, default=None, help="Cycles per variant (as `run --cycles`).")
    group.addoption("--specwake-tp", type=int, default=None, help="Tensor parallel size (as `run --tp`).")
    parser.addini(INI_FOLDERS, type="paths", default=[], help="Folders whose scenario files pytest collects.")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in (("cpu", "a scenario that runs on any CPU"), ("gpu", "a scenario that needs GPUs")):
        config.addinivalue_line("markers", f"{name}: specwake: {text}")
    # Folders of specwake_scenarios join the collection when pytest runs on its default paths.
    folders = [str(p) for p in config.getini(INI_FOLDERS)]
    if folders and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [*config.args, *(f for f in folders if f not in config.args)]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller, for each worker it starts: note the test-run id all the workers share."""
    node.config.stash[_TESTRUN] = node.workerinput["testrunuid"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On xdist's controller, once its workers are done: remove their shared folder (if they made one)."""
    testrun = session.config.stash.get(_TESTRUN, None)
    if testrun is not None:
        shutil.rmtree(_shared_folder(testrun), ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A scenario item's call lasts its variant's own seconds: the first item ran the whole scenario, and under
    xdist the others may have waited for it; pytest's JUnit and --durations take the time from here."""
    report = yield
    if isinstance(item, VariantItem) and call.when == "call" and item.seconds is not None:
        report.duration = item.seconds
    return report


def _shared_folder(testrun: str) -> Path:
    from specwake.prepare.models import cache_dir

    return cache_dir() / XDIST_FOLDER / testrun


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix != ".toml" or not _asked_for(file_path, parent.config) or not _is_scenario(file_path):
        return None
    return ScenarioFile.from_parent(parent, path=file_path)


def _asked_for(path: Path, config: pytest.Config) -> bool:
    """Whether `path` was named on the command line (itself or a folder above it) or lies in a scenario folder."""
    roots = [Path(p) for p in config.getini(INI_FOLDERS)]
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        here = config.invocation_params.dir
        roots += [here / arg.split("::")[0] for arg in config.args]
    resolved = path.resolve()
    return any(resolved == root.resolve() or root.resolve() in resolved.parents for root in roots)


def _is_scenario(path: Path) -> bool:
    """A TOML file with a [server] table (a broken file is reported by the scenario loader, not skipped)."""
    try:
        return isinstance(tomllib.loads(path.read_text(encoding="utf-8")).get("server"), dict)
    except (OSError, UnicodeDecodeError):
        return False
    except tomllib.TOMLDecodeError:
        return True


class ScenarioFile(pytest.File):
    """One scenario file: its variants as items; the scenario run once, by the first item that runs."""

    outcome: tuple[list[ScenarioResult], Path | None] | None = None
    problem: SpecwakeError | None = None

    def collect(self) -> Iterator[VariantItem]:
        from specwake.prepare.scenario import load_scenario

        try:
            scenario = load_scenario(self.path, self._overrides())
        except SpecwakeError as exc:
            raise self.CollectError(str(exc)) from None
        server = scenario.server
        gpu = scenario.cycle.discard == "native" or server.gpu_memory_utilization is not None
        method = scenario.speculative.get("method") if scenario.speculative else None
        for variant in scenario.variants:
            item = VariantItem.from_parent(self, name=variant.name)
            item.add_marker("gpu" if gpu else "cpu")
            if isinstance(method, str) and variant.speculative:
                marker = method.replace("-", "_")
                self.config.addinivalue_line("markers", f"{marker}: specwake: drafter method {method}")
                item.add_marker(marker)
            yield item

    def _overrides(self, variants: tuple[str, ...] = ()) -> Any:
        from specwake.prepare.scenario import Overrides

        option = self.config.option
        patch = Path(option.specwake_patch) if option.specwake_patch else None
        return Overrides(cycles=option.specwake_cycles, tp=option.specwake_tp, variants=variants, patch=patch)

    def result(self) -> ScenarioResult:
        """The scenario's result, run on first call with the variants selected in this session."""
        if self.problem is not None:
            raise self.problem
        if self.outcome is None:
            workerinput = getattr(self.config, "workerinput", None)
            try:
                if workerinput is None:
                    self.outcome = self._run()
                else:
                    self.outcome = Turns(_shared_folder(workerinput["testrunuid"])).run_once(self.nodeid, self._run)
            except Interrupted:
                raise KeyboardInterrupt from None  # pytest ends the session as on any Ctrl-C (result files are kept)
            except SpecwakeError as exc:
                self.problem = exc
                raise
        results, _ = self.outcome
        return results[0]

    def _run(self) -> tuple[list[ScenarioResult], Path | None]:
        from specwake.prepare.models import cache_dir
        from specwake.run.session.session import RunRequest, execute

        selected = tuple(item.name for item in self.session.items if item.parent is self)
        option = self.config.option
        request = RunRequest(
            scenarios=[self.path],
            overrides=self._overrides(selected),
            output=self.config.invocation_params.dir / option.specwake_output,
            cache=cache_dir(),
        )
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        verbose = self.config.get_verbosity() > 0

        def progress(event: Event) -> None:
            if verbose and reporter is not None:
                reporter.write_line(f"specwake: {event}")

        outcome = execute(request, progress)
        if outcome.run_root is not None:
            progress(Event(f"results in {outcome.run_root}"))
        return outcome.results, outcome.run_root


class Turns:
    """The workers of one pytest-xdist session run scenarios one at a time, each once: under a lock file in a folder
    they share, a worker runs a scenario and records how it ended — its run folder, or the error it ended with — and a
    worker whose items belong to a recorded scenario reads its results from the run folder instead."""

    _ERRORS: dict[str, type[SpecwakeError]] = {"input": InputError, "infra": InfraError}

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def run_once(self, scenario: str, run: Callable[[], Outcome]) -> Outcome:
        import fcntl  # POSIX, as runs are; imported here so that pytest itself loads the plugin anywhere

        record = self.folder / f"{hashlib.sha256(scenario.encode()).hexdigest()[:16]}.json"
        if record.is_file():  # written whole (write_atomic), once the run's files are
            return self._recorded(record)
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "turn.lock", "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its worker dies
            if record.is_file():  # run by the worker that had the turn before
                return self._recorded(record)
            try:
                outcome = run()
            except Interrupted:
                raise  # nothing recorded: the session is ending
            except SpecwakeError as exc:
                kind = next((k for k, cls in self._ERRORS.items() if isinstance(exc, cls)), "other")
                write_atomic(record, json.dumps({"error": kind, "message": str(exc)}))
                raise
            _, root = outcome
            write_atomic(record, json.dumps({"run": str(root) if root is not None else None}))
            return outcome

    def _recorded(self, record: Path) -> Outcome:
        from specwake.runfolder import load_result, scenario_results

        data = json.loads(record.read_text(encoding="utf-8"))
        if "error" in data:
            raise self._ERRORS.get(data["error"], SpecwakeError)(data["message"])
        root = Path(data["run"]) if data["run"] is not None else None
        return [load_result(p) for p in scenario_results(root)] if root is not None else [], root


class VariantFailed(Exception):
    """A variant that did not meet its expectation, or has a finding: its text is the verdict."""


class VariantItem(pytest.Item):
    parent: ScenarioFile
    seconds: float | None = None  # the variant's own, once its result is known

    def reportinfo(self) -> tuple[Path, None, str]:
        # The name that heads a failure. Not `FILE::VARIANT`: pytest's verbose lines rewrite a name the node id
        # ends with, '.' to '::' (_pytest/terminal.py, _locationline).
        return self.path, None, f"{self.name} ({self.path.name})"

    def runtest(self) -> None:
        from specwake.judge.verdict import recorded_tolerance
        from specwake.report.junit import passed, variant_text

        try:
            result = self.parent.result()
        except InputError as exc:
            raise VariantFailed(str(exc)) from None
        except InfraError as exc:
            pytest.skip(str(exc))
        variant = next((v for v in result.variants if v.name == self.name), None)
        if variant is None:
            raise VariantFailed(f"{self.name}: not in the run's results (see {result.scenario.get('file')})")
        self.seconds = variant.seconds
        self.user_properties += properties(variant)
        if not passed(variant):
            raise VariantFailed(variant_text(variant, recorded_tolerance(result)))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, VariantFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style))


def properties(variant: VariantResult) -> list[tuple[str, object]]:
    """The figures an item records: outcome, expectation, AL fresh and after each cycle, tok/s after the cycles
    against fresh, the slowest cycle's wake seconds, and the variant's own seconds."""
    from specwake.judge.verdict import speed_after_cycles

    props: list[tuple[str, object]] = [("outcome", variant.outcome), ("expected", variant.expected)]
    for stage in variant.stages_by_cycle:
        key = "al_fresh" if stage.cycle == 0 else f"al_after_cycle_{stage.cycle}"
        props.append((key, stage.acceptance_length))
    call = speed_after_cycles(variant.stages, SPEED_RATIO_SHOWN)
    props.append(("tok_s_ratio", round(call.ratio, 3) if call is not None and call.ratio is not None else None))
    wake = variant.wake_seconds()
    props.append(("wake_seconds", round(max(wake.values()), 3) if wake else None))
    props.append(("variant_seconds", round(variant.seconds, 1)))
    return props
