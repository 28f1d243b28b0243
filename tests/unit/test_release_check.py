"""tests/helpers/release_check.py, `make releases`: what its checks find in a release's sources decides the release's
line and the exit status. Run on a small vLLM-shaped tree that has every flag the shipped scenarios start a server with
and every metric name specwake reads, but for the one a test takes out."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.prepare.releases import TESTED_RELEASES
from specwake.run.measure.metrics import GENERATION_TOKENS
from tests.helpers.release_check import (
    METRIC_NAMES,
    UNTESTED_NEWEST,
    WORKER_CLASS,
    Finding,
    Release,
    ReleaseCheck,
    check_flags,
    check_metrics,
    check_release,
    check_routes_and_rpcs,
    check_sleep_facts,
    exit_status,
    final_status,
    flags_passed,
    main,
    metric_in_source,
    releases_to_check,
    routes_called,
    shipped_scenarios,
    with_drops,
)

SCENARIOS = tuple(shipped_scenarios())


def small_release(root: Path, *, without: str | None = None) -> Path:
    """vllm/engine/arg_utils.py adding every flag the scenarios pass (but `without`), and a metrics module naming every
    metric specwake reads (but `without`), as vLLM names them."""
    flags = sorted(f for f in flags_passed(SCENARIOS) if f != without)
    metrics = [metric_in_source(m) for m in METRIC_NAMES if m != without]
    (root / "vllm" / "engine").mkdir(parents=True)
    (root / "vllm" / "engine" / "arg_utils.py").write_text("".join(f'parser.add_argument("{f}")\n' for f in flags))
    (root / "vllm" / "metrics.py").write_text("".join(f'Counter(name="{m}")\n' for m in metrics))
    return root


def check(tree: Path, tmp_path: Path):
    return check_release(Release("9.9.9", tree, SCENARIOS, tmp_path / "overlays"), (check_flags, check_metrics))


def test_a_release_with_everything_is_ok(tmp_path: Path) -> None:
    result = check(small_release(tmp_path / "tree"), tmp_path)
    assert result.failures == [] and exit_status([result]) == 0
    passed = len(flags_passed(SCENARIOS))
    assert result.line() == f"vLLM 9.9.9 (not tested): scenario flags {passed}/{passed}; metrics 7/7 -> ok"


def test_a_metric_name_missing_from_the_source_fails_the_release_and_the_run(tmp_path: Path) -> None:
    ok = check(small_release(tmp_path / "ok"), tmp_path)
    result = check(small_release(tmp_path / "tree", without=GENERATION_TOKENS), tmp_path)
    assert result.failures == [f"metric {GENERATION_TOKENS} is not in its source"]
    assert result.line().endswith(f"metrics 6/7 -> FAILED: metric {GENERATION_TOKENS} is not in its source")
    assert exit_status([ok, result]) == 1


def test_a_flag_the_release_does_not_parse_fails_it(tmp_path: Path) -> None:
    result = check(small_release(tmp_path / "tree", without="--enable-sleep-mode"), tmp_path)
    (failure,) = result.failures
    assert failure.startswith("flag --enable-sleep-mode (") and failure.endswith(") is not the release's")
    assert exit_status([result]) == 1


def test_the_api_servers_own_flags_come_from_its_frontend_argument_classes(tmp_path: Path) -> None:
    """--host, --port and --enable-prompt-tokens-details are fields of the API server's argument class."""
    tree = small_release(tmp_path / "tree", without="--port")
    assert check(tree, tmp_path).failures != []
    (tree / "vllm" / "entrypoints").mkdir()
    (tree / "vllm" / "entrypoints" / "cli_args.py").write_text("class FrontendArgs:\n    port: int = 8000\n")
    assert check(tree, tmp_path).failures == []


@pytest.mark.parametrize(("newest", "extra"), [(TESTED_RELEASES[-1], []), ("99.0.0", ["99.0.0"])])
def test_the_newest_release_is_checked_with_the_tested_ones(newest: str, extra: list[str]) -> None:
    assert releases_to_check(newest) == [*TESTED_RELEASES, *extra]


# -- a local source tree (make releases TREE=PATH) ------------------------------------------------------------------


def test_a_folder_that_is_no_vllm_tree_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tree", str(tmp_path)]) == 2
    assert "not a vLLM source tree" in capsys.readouterr().err


def serving_tree(
    root: Path, *, without_route: str | None = None, worker_body: str = "def reload_weights(self): ..."
) -> Path:
    """A tree whose API server answers every route specwake calls (but `without_route`), each the way vLLM declares
    one, and whose Worker has `worker_body`."""
    routes = [r for r in routes_called() if r != without_route]
    router = "".join(f'@router.post("{r}")\ndef handler_{i}(): ...\n' for i, r in enumerate(routes) if r != "/metrics")
    router += 'routes = [Mount("/metrics", app)]\n' if "/metrics" in routes else ""
    (root / "vllm" / "entrypoints" / "serve").mkdir(parents=True)
    (root / "vllm" / "entrypoints" / "serve" / "api_router.py").write_text(router)
    (root / "vllm" / "v1" / "worker").mkdir(parents=True)
    (root / "vllm" / "v1" / "worker" / "gpu_worker.py").write_text(f"class Worker:\n    {worker_body}\n")
    return root


def test_every_route_and_worker_method_specwake_calls_is_the_releases(tmp_path: Path) -> None:
    release = Release("9.9.9", serving_tree(tmp_path / "ok"), SCENARIOS, tmp_path)
    (finding,) = check_routes_and_rpcs(release)
    assert (
        finding.failures == ()
        and finding.counted == f"routes {len(routes_called())}/{len(routes_called())}; Worker methods 1/1"
    )
    assert {"/sleep", "/wake_up", "/collective_rpc", "/metrics", "/v1/completions"} <= set(routes_called())


def test_a_route_the_api_server_lost_fails_the_release(tmp_path: Path) -> None:
    release = Release("9.9.9", serving_tree(tmp_path / "t", without_route="/wake_up"), SCENARIOS, tmp_path)
    (finding,) = check_routes_and_rpcs(release)
    (failure,) = finding.failures
    assert failure.startswith("route /wake_up (protocol.py step ") and failure.endswith(
        "is not one of its API server's"
    )


@pytest.mark.parametrize("body", ["def reload_model_weights(self): ...", "reload_weights: Callable[..., None]"])
def test_a_worker_without_the_reload_specwake_sends_by_name_fails_the_release(tmp_path: Path, body: str) -> None:
    """The cycle's reload is a string over /collective_rpc: renamed, or only declared, it is named."""
    release = Release("9.9.9", serving_tree(tmp_path / "t", worker_body=body), SCENARIOS, tmp_path)
    (finding,) = check_routes_and_rpcs(release)
    (failure,) = finding.failures
    assert failure == f"worker method 'reload_weights' is neither specwake's extension's nor a method of {WORKER_CLASS}"


SLEEPING_WORKER = """
class Worker:
    def _get_sleep_parameters(self, model):
        parameters = dict(model.named_parameters())
        parameters.update((f"draft.{name}", p) for name, p in self.get_draft_model().named_parameters())
        return parameters

    def _save_sleep_parameters(self, model):
        for pattern in self.model_config.sleep_preserve_parameter_names:
            if not fnmatch_filter(self._get_sleep_parameters(model), pattern) and pattern != "draft.*":
                raise ValueError(pattern)
        self._sleep_saved_buffers = {}
"""


def sleeping_tree(root: Path, source: str) -> Path:
    (root / "vllm" / "v1" / "worker").mkdir(parents=True)
    (root / "vllm" / "v1" / "worker" / "gpu_worker.py").write_text(source)
    return root


@pytest.mark.parametrize(
    ("version", "change", "failure"),
    [
        ("0.33.0", None, None),
        ("0.33.0", ('f"draft.{name}"', 'f"drafter.{name}"'), "names the drafter's parameters ['drafter.']"),
        ("0.33.0", ('pattern != "draft.*"', 'pattern != "drafter.*"'), "lets ['drafter.*'] match nothing"),
        ("0.34.0", None, "has the marks of rules ['0.33']; specwake applies '0.34' to vLLM 0.34.0"),
        ("0.34.0", ("_sleep_saved_buffers", "_discardable_parameters"), None),
    ],
)
def test_the_sleep_rules_specwake_emulates_are_the_releases(
    tmp_path: Path, version: str, change: tuple[str, str] | None, failure: str | None
) -> None:
    source = SLEEPING_WORKER.replace(*change) if change else SLEEPING_WORKER
    (finding,) = check_sleep_facts(Release(version, sleeping_tree(tmp_path, source), SCENARIOS, tmp_path))
    if failure is None:
        assert finding.failures == () and finding.counted == "sleep facts 3/3"
    else:
        (found,) = finding.failures
        assert failure in found, found


def test_a_count_that_fell_from_the_release_before_is_named_in_the_line() -> None:
    def checked(version: str, worker: int) -> ReleaseCheck:
        counts = (("worker uses checked", worker),)
        return ReleaseCheck(version, (Finding(f"uses checked: worker {worker}", (), counts),))

    older, same, fewer = checked("9.8.0", 119), checked("9.9.0", 119), checked("9.9.0", 115)
    assert with_drops(same, older) == same and with_drops(older, None) == older
    line = with_drops(fewer, older).line()
    assert line.endswith("uses checked: worker 115; worker uses checked fell from 119 (vLLM 9.8.0) to 115 -> ok")


def test_an_untested_newest_release_has_its_own_exit_status_and_a_failed_check_wins() -> None:
    ok, broken = ReleaseCheck("9.9.0", (Finding("n 1"),)), ReleaseCheck("9.9.0", (Finding("n 1", ("gone",)),))
    assert final_status([ok], TESTED_RELEASES[-1]) == (0, "every release checked is ok")
    status, line = final_status([ok], "99.0.0")
    assert status == UNTESTED_NEWEST == 3 and line.startswith("vLLM 99.0.0 is of no tested series")
    assert final_status([ok, broken], "99.0.0")[0] == 1
