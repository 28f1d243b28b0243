"""Lifecycle tests of specwake.run.server.server against tests/helpers/fake_server.py (real processes, no vLLM):
start, readiness, startup failures, SIGTERM/SIGKILL of the whole group, idempotent stop."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwake.errors import StartupFailed
from specwake.run.server.server import (
    Server,
    ServerGroup,
    ServerSpec,
    describe_exit,
    free_port,
    local_client,
    redact_env,
    tail_lines,
)
from tests.helpers.paths import FAKE_SERVER
from tests.helpers.procs import assert_no_leftover_processes, leftover_processes, running

pytestmark = pytest.mark.usefixtures("leak_check")


def fake_spec(tmp_path: Path, *args: str, timeout: float = 20.0, **env: str) -> ServerSpec:
    port = free_port()
    return ServerSpec(
        argv=[sys.executable, str(FAKE_SERVER), "--port", str(port), *args],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1", **env},
        port=port,
        log_path=tmp_path / "logs" / "server.log",
        startup_timeout_s=timeout,
    )


def fast(spec: ServerSpec, **kw: float) -> Server:
    return Server(spec, poll_interval_s=0.05, grace_s=kw.get("grace_s", 5.0))


def test_ready_server_answers_and_stop_leaves_nothing(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path, "--spawn-child", "--model", "tiny")
    with running(fast(spec)) as server:
        assert server.base_url == f"http://127.0.0.1:{spec.port}"
        assert server.alive()
        assert httpx.get(f"{server.base_url}/health").status_code == 200
        assert httpx.get(f"{server.base_url}/v1/models").json()["data"][0]["id"] == "tiny"
        pgid = server.pgid
        assert pgid is not None
        assert len(leftover_processes([pgid])) == 2  # the server and its child share the group
    assert not server.alive()
    assert server.returncode() == -signal.SIGTERM
    assert_no_leftover_processes([pgid])


def test_never_ready_times_out_naming_url_seconds_and_log(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path, "--mode", "never-ready", "--spawn-child", timeout=3.0)  # time to answer 503 once
    server = fast(spec)
    with pytest.raises(StartupFailed) as info:
        with running(server):
            pytest.fail("a never-ready server must not enter the with block")
    message = str(info.value)
    assert "seconds" in message
    assert f"{server.base_url}/health" in message
    assert str(spec.log_path) in message
    assert "HTTP 503" in message
    assert "503" in info.value.log_tail  # the tail is the log's end: the health polls it answered
    assert "Starting vLLM API server" in spec.log_path.read_text()
    assert server.pgid is not None
    assert_no_leftover_processes([server.pgid])


@pytest.mark.timeout(60)  # promptness: a 600 s deadline would hang here, not pass slowly
def test_exit_early_fails_promptly_with_log_tail(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path, "--mode", "exit-early", "--spawn-child", timeout=600.0)
    server = fast(spec)
    with pytest.raises(StartupFailed) as info, running(server):
        pass
    assert "exited with code 1 before ready" in str(info.value)
    assert "RuntimeError: Engine core initialization failed" in info.value.log_tail
    assert server.returncode() == 1
    assert server.pgid is not None
    assert_no_leftover_processes([server.pgid])  # the orphaned child was killed too


def test_sigterm_ignored_escalates_to_sigkill(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path, "--ignore-sigterm", "--spawn-child")
    with running(Server(spec, poll_interval_s=0.05, grace_s=0.5)) as server:
        pgid = server.pgid
    assert server.returncode() == -signal.SIGKILL
    assert pgid is not None
    assert_no_leftover_processes([pgid])


def test_child_surviving_sigterm_is_killed(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path, "--child-ignore-sigterm", "--spawn-child")
    with running(Server(spec, poll_interval_s=0.05, grace_s=0.5)) as server:
        pgid = server.pgid
    assert server.returncode() == -signal.SIGTERM  # the leader itself went politely
    assert pgid is not None
    assert_no_leftover_processes([pgid])


@pytest.mark.parametrize("error", [ValueError("boom"), KeyboardInterrupt()])
def test_exception_in_with_block_stops_server_and_propagates(tmp_path: Path, error: BaseException) -> None:
    server = fast(fake_spec(tmp_path, "--spawn-child"))
    with pytest.raises(type(error)):
        with running(server):
            raise error
    assert not server.alive()
    assert server.pgid is not None
    assert_no_leftover_processes([server.pgid])


def test_stop_is_idempotent(tmp_path: Path) -> None:
    server = fast(fake_spec(tmp_path))
    server.stop()  # never started: nothing to do
    server.start()
    assert server.wait_ready() >= 0.0
    server.stop()
    code = server.returncode()
    server.stop()
    assert code == server.returncode() == -signal.SIGTERM


def test_log_has_header_redacted_env_and_appends(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path, HF_TOKEN="hf_verysecret", VLLM_CPU_KVCACHE_SPACE="1")
    for _ in range(2):
        with running(Server(spec, poll_interval_s=0.05)):
            pass
    text = spec.log_path.read_text()
    assert text.count("# specwake: server start") == 2
    assert f"--port {spec.port}" in text
    assert "HF_TOKEN=***" in text and "hf_verysecret" not in text
    assert "VLLM_CPU_KVCACHE_SPACE=1" in text
    assert "Starting vLLM API server" in text  # the server's own output follows each header


def test_missing_executable_is_startup_failed(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path)
    spec = ServerSpec(
        argv=[str(tmp_path / "no-such-python"), *spec.argv[1:]],
        env=spec.env,
        port=spec.port,
        log_path=spec.log_path,
        startup_timeout_s=1.0,
    )
    with pytest.raises(StartupFailed, match="cannot launch"):
        with running(fast(spec)):
            pass


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_pure_helpers() -> None:
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(-9) == "killed by signal SIGKILL"
    assert redact_env({"HF_TOKEN": "x", "api_key": "y", "PATH": "/bin"}) == {
        "HF_TOKEN": "***",
        "api_key": "***",
        "PATH": "/bin",
    }
    assert tail_lines(b"a\nb\nc\n", 2) == "b\nc"
    assert tail_lines(b"a\xffb", 5) == "a\ufffdb"


def spec_counters(metrics: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name.startswith("vllm:spec_decode") and sample.name.endswith("_total"):
                key = sample.name + sample.labels.get("position", "")
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def test_fake_server_acceptance_collapses_after_discard(tmp_path: Path) -> None:
    """The fake's counters give AL = --al-fresh before a discard and --al-after after it."""
    spec = fake_spec(tmp_path, "--k", "3", "--al-fresh", "4", "--al-after", "1", "--engines", "2")
    with running(fast(spec)) as server, httpx.Client(base_url=server.base_url) as http:

        def measured_al() -> tuple[float, str]:
            before = spec_counters(http.get("/metrics").text)
            body = {"model": "fake-model", "prompt": "hi there", "max_tokens": 16}
            texts = [http.post("/v1/completions", json=body).json() for _ in range(2)]
            after = spec_counters(http.get("/metrics").text)
            delta = {k: after[k] - before.get(k, 0.0) for k in after}
            assert texts[0]["usage"]["completion_tokens"] == 16
            al = 1 + delta["vllm:spec_decode_num_accepted_tokens_total"] / delta["vllm:spec_decode_num_drafts_total"]
            return al, texts[0]["choices"][0]["text"]

        fresh_al, fresh_text = measured_al()
        assert http.post("/sleep", params={"level": 2}).json()["level"] == 2
        assert http.get("/is_sleeping").json() == {"is_sleeping": True}
        http.post("/wake_up", params={"tags": "weights"})
        rpc = http.post("/collective_rpc", json={"method": "reload_weights"})
        assert rpc.json() == {"results": [None]}
        http.post("/wake_up", params={"tags": "kv_cache"})
        assert http.get("/is_sleeping").json() == {"is_sleeping": False}
        after_al, after_text = measured_al()
    assert (fresh_al, after_al) == (4.0, 1.0)
    assert fresh_text == after_text


def test_fake_server_crash_on_reload_dies_with_cuda_message(tmp_path: Path) -> None:
    spec = fake_spec(tmp_path, "--mode", "crash-on-reload")
    with running(fast(spec)) as server:
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{server.base_url}/collective_rpc", json={"method": "reload_weights"})
        while server.alive():  # the pytest-timeout guards against a hang here
            time.sleep(0.05)
        assert server.returncode() == 1
        assert "CUDA error: an illegal memory access" in server.log_tail()


def test_a_group_of_servers_starts_fails_and_stops_as_one(tmp_path: Path) -> None:
    """A variant's servers where specwake balances the load: ready when each is, failed when one exits (its log
    named), and stopped together, nothing left."""
    specs = [fake_spec(tmp_path, "--spawn-child") for _ in range(2)]
    specs[1] = replace(specs[1], log_path=tmp_path / "logs" / "server.server1.log")
    group = ServerGroup([fast(spec) for spec in specs])
    try:
        group.start()
        group.wait_ready()
        assert group.alive() and not group.exited_within(0.1) and group.rss_bytes()
        first, second = group.servers
        assert second.pgid is not None
        os.killpg(second.pgid, signal.SIGKILL)
        assert group.exited_within(5.0) and not group.alive() and group.returncode() == -signal.SIGKILL
        assert group.log_tail().startswith("# server.server1.log\n")  # the server that exited
        pgids = [s.pgid for s in group.servers]
    finally:
        group.stop()
    assert not first.alive()
    assert_no_leftover_processes([p for p in pgids if p is not None])


def test_a_group_waits_on_its_server_while_another_nodes_engines_run_and_fails_when_they_exit(tmp_path: Path) -> None:
    """server.nodes: the other node's process has no HTTP server; the group is ready when the API server is, and a
    node that exits while the server starts fails the start, with the node's log, leaving nothing behind."""
    head = fake_spec(tmp_path, "--startup-delay", "3")
    node = ServerSpec(
        argv=[sys.executable, "-c", "import time; print('node up', flush=True); time.sleep(1); raise SystemExit(3)"],
        env={"PATH": os.environ.get("PATH", "")}, port=0, log_path=tmp_path / "logs" / "server.node1.log",
        startup_timeout_s=20, http=False,
    )  # fmt: skip
    group = ServerGroup([fast(head), fast(node)])
    group.start()
    pgids = [s.pgid for s in group.servers]
    with pytest.raises(StartupFailed) as caught:
        group.wait_ready()  # stops the group
    assert "exited with code 3" in str(caught.value) and "server.node1.log" in str(caught.value)
    assert "node up" in caught.value.log_tail
    assert_no_leftover_processes([p for p in pgids if p is not None])
    ready = ServerGroup(
        [fast(fake_spec(tmp_path)), fast(replace(node, argv=[sys.executable, "-c", "import time; time.sleep(60)"]))]
    )
    try:
        ready.start()
        ready.wait_ready()
        assert ready.alive() and len(ready.http) == 1
    finally:
        ready.stop()


def test_local_clients_share_one_tls_context_and_reach_a_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients of a run's servers load the CA bundle once between them, where plain httpx clients load it each; they
    ignore the environment's proxies, and answer as any client does."""
    made: list[object] = []
    shipped = ssl.create_default_context

    def counted(*args: object, **kwargs: object) -> ssl.SSLContext:
        made.append(args or kwargs)
        return shipped(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    local_client.__globals__["_tls_context"].cache_clear()
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # a proxy that answers nothing: must not be used
    clients = [local_client() for _ in range(3)]
    assert len(made) == 1
    plain = [httpx.Client(trust_env=False) for _ in range(2)]  # httpx's own default: a context each
    assert len(made) == 3
    with running(fast(fake_spec(tmp_path))) as server, local_client(server.base_url) as client:
        assert client.get("/health").status_code == 200  # readiness polled with a local client as well
    for one in [*clients, *plain]:
        one.close()
