"""The Hub ids that a GPU scenario's header says vLLM's own code names are on the cited line of that release's
sources (the GPU wheel's Python files, tests/helpers/releases.py)."""

from __future__ import annotations

import pytest

from tests.helpers.hub_sources import GPU_SCENARIOS, Source, sources
from tests.helpers.releases import release_tree

CITED = [s for path in GPU_SCENARIOS for s in sources(path).values() if s.kind == "code"]


@pytest.mark.parametrize("source", CITED, ids=lambda s: f"{s.model}@{s.version}")
def test_the_cited_release_line_names_the_id(source: Source) -> None:
    assert source.version is not None and source.line is not None
    lines = (release_tree(source.version) / source.where).read_text(encoding="utf-8").splitlines()
    assert source.model in lines[source.line - 1], f"{source.where}:{source.line}: {lines[source.line - 1]!r}"


def test_some_ids_are_cited_from_the_code() -> None:
    assert {s.model for s in CITED} >= {"deepseek-ai/dspark_qwen3_8b_block7", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
