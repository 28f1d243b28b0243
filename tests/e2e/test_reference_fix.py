"""The reference fix (scenarios/patches/draft-reload.diff) applied to the installed vLLM, exercised on small torch
modules shaped like vLLM drafters: the parts a CPU run cannot reach, DSpark's fused-buffer rebuild first among them
(DSpark needs a GPU). Each check runs tests/helpers/reference_fix_program.py with the patched overlay first on
PYTHONPATH. The families e2e (tests/e2e/test_families.py) runs the same patch on real vLLM servers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import installed_vllm, launch_env, require_module

require_module("vllm")

from specwake.prepare.overlay import Overlay, build_overlay  # noqa: E402
from tests.helpers.paths import HELPERS, REPO  # noqa: E402

PATCH = REPO / "scenarios" / "patches" / "draft-reload.diff"
NAIVE = REPO / "tests" / "data" / "naive-draft-reload.diff"
PROGRAM = HELPERS / "reference_fix_program.py"
CHECKS = (
    "shared_embedding_is_never_written",
    "tied_draft_head_is_refilled_from_the_embedding_tensor",
    "modules_are_rebound_when_loading_fails",
    "fused_buffers_are_rebuilt_after_finalization",
    "fused_buffers_keep_their_addresses",
    "draft_attention_scales_survive_the_reload",
)


def overlay_of(diff: Path, cache: Path) -> Overlay:
    """`diff` applied to the installed vLLM, found without importing it (specwake's probe imports vLLM in a process of
    its own: 8 s a check, four checks)."""
    package, version = installed_vllm()
    return build_overlay(diff, package, version, cache)


def checks_without(tmp_path: Path, line: str, replacement: str) -> dict[str, str]:
    """The checks on the reference fix with one of its added lines replaced by another (one line for one: the hunk
    stays valid): an almost-right fix."""
    text = PATCH.read_text()
    assert line in text
    almost = tmp_path / "almost-right.diff"
    almost.write_text(text.replace(line, replacement))
    return run_checks(overlay_of(almost, tmp_path / "cache"))


def run_checks(overlay: Overlay) -> dict[str, str]:
    """check name → "ok" or the failure line the program printed."""
    env = {**launch_env(), "PYTHONPATH": str(overlay.root)}
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), *CHECKS], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )
    outcomes = {}
    for line in proc.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("ok", "FAIL"):
            outcomes[rest.split(":")[0]] = "ok" if word == "ok" else line
    return outcomes or {"program": proc.stderr[-3000:]}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return run_checks(overlay_of(PATCH, tmp_path_factory.mktemp("cache")))


@pytest.mark.parametrize("name", CHECKS)
def test_reference_fix(outcomes: dict[str, str], name: str) -> None:
    assert outcomes.get(name) == "ok", outcomes


def test_the_checks_can_fail_on_the_naive_fix(tmp_path: Path) -> None:
    """The naive fix has no unbinding of target modules and no tied-head refill: the same checks must fail."""
    naive = run_checks(overlay_of(NAIVE, tmp_path / "cache"))
    assert naive.get("fused_buffers_are_rebuilt_after_finalization") != "ok"
    assert naive.get("fused_buffers_keep_their_addresses") != "ok"
    assert naive.get("draft_attention_scales_survive_the_reload") != "ok"
    assert naive.get("shared_embedding_is_never_written") != "ok"


def test_the_address_check_fails_on_a_fix_that_rebuilds_into_new_storage(tmp_path: Path) -> None:
    """The reference fix as it was before it copied rebuilt attributes back: the values are right, the storage new."""
    outcomes = checks_without(tmp_path, "+    copied = _copy_into_captured(captured)\n", "+    copied = 0\n")
    assert outcomes.get("fused_buffers_are_rebuilt_after_finalization") == "ok"
    assert "the fused buffer moved to new storage" in outcomes.get("fused_buffers_keep_their_addresses", "")


def test_the_scale_check_fails_on_a_fix_that_leaves_finalize_s_scales(tmp_path: Path) -> None:
    """The reference fix as it was before it put the drafter's attention scales back: they end up at 1.0."""
    outcomes = checks_without(tmp_path, "+    _restore_kv_scales(kv_scales)\n", "+    del kv_scales\n")
    assert outcomes.get("fused_buffers_keep_their_addresses") == "ok"
    failed = outcomes.get("draft_attention_scales_survive_the_reload", "")
    assert "scales after the reload: (1.0, 1.0, 1.0, 1.0)" in failed
