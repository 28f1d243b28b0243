"""`specwake check --online` through the real CLI, against a local stand-in for the Hub's model API (HF_ENDPOINT, the
variable huggingface_hub reads too): a model id the Hub does not have is one line naming file and key, exit 2,
nothing launched; ids it has are listed as on the Hub; a model neither this machine nor the Hub can confirm is exit 3,
never "ok"."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers.fakeengine import FakeEngine, run_cli, scenario_text

ON_THE_HUB = {"org/target", "gpt2"}


class HubApi(BaseHTTPRequestHandler):
    """GET /api/models/<id>: 200 with metadata for a repository it has; otherwise what the Hub answers a request
    without a token for a repository it does not show: 401, X-Error-Code RepoNotFound."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        repo = self.path.split("/api/models/", 1)[-1]
        if repo in ON_THE_HUB:
            status, headers, body = 200, {}, {"id": repo, "modelId": repo}
        else:
            status, body = 401, {"error": "Repository not found"}
            headers = {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Type": "application/json"}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def write(engine: FakeEngine, tmp_path: Path, drafter: str) -> Path:
    text = scenario_text(engine, model="org/target")
    head, spec = text.split("[speculative]\n", 1)
    path = tmp_path / "s.toml"
    path.write_text(head + "[speculative]\n" + spec.replace('model = "org/target"', f'model = "{drafter}"', 1))
    return path


def test_an_id_the_hub_does_not_have_is_bad_input(engine: FakeEngine, tmp_path: Path, hub: str) -> None:
    scenario = write(engine, tmp_path, "org/targte")
    proc = run_cli(
        ["check", "--online", str(scenario)], tmp_path / "cache", HF_ENDPOINT=hub, HF_HUB_CACHE=str(tmp_path)
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [
        f"error: {scenario}: speculative.model: 'org/targte' does not exist on the Hub (or is private, and HF_TOKEN"
        " does not reach it): HTTP 401 RepoNotFound"
    ]
    assert engine.invocations() == [] and engine.launched() == []  # refused before vLLM was asked anything


def test_ids_the_hub_has_are_listed(engine: FakeEngine, tmp_path: Path, hub: str) -> None:
    scenario = write(engine, tmp_path, "org/target")
    proc = run_cli(
        ["check", "--online", str(scenario)], tmp_path / "cache", HF_ENDPOINT=hub, HF_HUB_CACHE=str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    assert "model org/target: on the Hub (not downloaded yet)" in proc.stdout
    assert engine.launched() == []


def closed_port() -> int:
    """A local port nothing listens on: a Hub that does not answer."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("gpt2", "not found locally; the Hub did not answer (ConnectError: {hub}/api/models/gpt2)"),  # a legacy id
        ("my model", "not found locally, and not a Hub repository id"),
    ],
)
def test_a_model_neither_here_nor_confirmed_by_the_hub_is_never_ok(
    engine: FakeEngine, tmp_path: Path, model: str, why: str
) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine, model=model))
    hub = f"http://127.0.0.1:{closed_port()}"
    proc = run_cli(
        ["check", "--online", str(scenario)], tmp_path / "cache", HF_ENDPOINT=hub, HF_HUB_CACHE=str(tmp_path)
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    reason = why.format(hub=hub)
    assert lines == [f"error: {scenario}: server.model: --online could not confirm {model!r}: {reason}"]
    assert "ok:" not in proc.stdout and engine.launched() == []


def test_a_legacy_id_without_a_namespace_is_asked_too(engine: FakeEngine, tmp_path: Path, hub: str) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine, model="gpt2"))
    proc = run_cli(
        ["check", "--online", str(scenario)], tmp_path / "cache", HF_ENDPOINT=hub, HF_HUB_CACHE=str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    assert "model gpt2: on the Hub (not downloaded yet)" in proc.stdout
