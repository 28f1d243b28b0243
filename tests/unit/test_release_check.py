"""tests/helpers/release_check.py, `make releases`: what its checks find in a release's sources decides the release's
line and the exit status. Run on a small vLLM-shaped tree that has every flag the shipped scenarios start a server with
and every metric name specwake reads, but for the one a test takes out."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.prepare.releases import TESTED_RELEASES
from specwake.run.metrics import GENERATION_TOKENS
from tests.helpers.release_check import (
    METRIC_NAMES,
    Release,
    check_flags,
    check_metrics,
    check_release,
    exit_status,
    flags_passed,
    main,
    metric_in_source,
    releases_to_check,
    shipped_scenarios,
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
