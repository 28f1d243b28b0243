"""Where things are, for every test tier: the repository, the tests' data, the helpers run as programs."""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
REPO = TESTS.parent
DATA = TESTS / "data"
FAKE_SERVER = HELPERS / "fake_server.py"  # a fake vLLM server, run as a program
REFERENCE_FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"
