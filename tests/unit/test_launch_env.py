"""The tests' own subprocesses (specwake runs, vLLM programs) get the VLLM_ variables the test process started with,
whatever an in-process vLLM (tests/e2e/test_vllm_facts.py builds a VllmConfig) wrote, changed or removed since."""

from __future__ import annotations

import pytest

from tests.helpers import procs


def test_vllm_variables_are_put_back_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        procs, "STARTING_ENV", {"VLLM_KEPT": "1", "VLLM_CHANGED": "fork", "VLLM_REMOVED": "x", "OTHER": "start"}
    )
    for key, value in {"VLLM_KEPT": "1", "VLLM_CHANGED": "spawn", "VLLM_ADDED": "y", "OTHER": "now"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("VLLM_REMOVED", raising=False)

    env = procs.launch_env()

    assert {k: v for k, v in env.items() if k.startswith("VLLM_")} == {
        "VLLM_KEPT": "1",
        "VLLM_CHANGED": "fork",
        "VLLM_REMOVED": "x",
    }
    assert env["OTHER"] == "now"  # the rest is the process's own, as a test set it
