"""/metrics oddities and security through the real CLI on fake servers: speculation off, counters going
backwards, counters that disagree with themselves, several engines; loopback-only binding, HF_TOKEN redaction,
overlay writes only in the cache.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.fakeengine import FakeEngine, one_run_dir, run_cli, scenario_text


def run(engine: FakeEngine, tmp: Path, text: str, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    scenario = tmp / "s.toml"
    scenario.write_text(text)
    out = tmp / "out"
    proc = run_cli(["run", str(scenario), "--output", str(out)], tmp / "cache", **env)
    assert engine.survivors() == []
    return proc, one_run_dir(out)


def baseline(folder: Path) -> dict:
    return json.loads((folder / "result.json").read_text())["variants"][0]


def test_speculation_silently_off_is_reported_not_divided_by_zero(engine: FakeEngine, tmp_path: Path) -> None:
    env = {"FAKE_VLLM_ARGS": "--no-spec-metrics"}
    proc, folder = run(
        engine, tmp_path, scenario_text(engine, variants={"baseline": env}, expect={"baseline": "recover"})
    )
    assert proc.returncode == 1, proc.stderr  # not a pass: nothing was measured
    base = baseline(folder)
    assert base["outcome"] == "degraded"
    assert all(s["num_drafts"] == 0 and s["acceptance_length"] is None for s in base["stages"])
    assert "no drafts" in (folder / "report.md").read_text()


def test_counters_going_backwards_are_flagged_never_negative(engine: FakeEngine, tmp_path: Path) -> None:
    env = {"FAKE_VLLM_ARGS": "--reset-counters-at 9"}  # an engine restart inside the measured part of stage 2
    proc, folder = run(engine, tmp_path, scenario_text(engine, variants={"baseline": env}))
    assert proc.returncode == 0, proc.stderr
    fresh, after = baseline(folder)["stages"]
    assert fresh["counters_reset"] is False and after["counters_reset"] is True
    assert after["num_drafts"] > 0 and after["num_accepted_tokens"] >= 0


def test_counters_that_disagree_with_themselves_are_never_read_as_al(engine: FakeEngine, tmp_path: Path) -> None:
    """The patch that should fool AL: a reloaded drafter (its weights as fresh) that drafts at AL 2, and a metrics path
    that counts the accepted tokens of AL 4 over its drafts, more than their per-position counts accept. Read as AL,
    the degraded drafter recovers."""
    env = {"FAKE_VLLM_ARGS": "--al-after 2 --phantom-accepted"}
    text = scenario_text(engine, variants={"baseline": env}, expect={"baseline": "recover"})
    proc, folder = run(engine, tmp_path, text)
    assert proc.returncode == 3, proc.stderr  # undecidable: not a pass, and nothing says the wake failed
    base = baseline(folder)
    assert base["outcome"] == "error" and not base["matched"]
    fresh, after = base["stages"]
    assert fresh["counters_disagree"] is None and fresh["acceptance_length"] is not None
    assert 1 + after["num_accepted_tokens"] / after["num_drafts"] == fresh["acceptance_length"]  # what would fool
    assert after["acceptance_length"] is None and after["counters_disagree"]
    assert sum(after["per_position"]) * after["num_drafts"] < after["num_accepted_tokens"]  # the planted fault
    assert base["findings"] == [
        f"vLLM's spec-decode metrics disagree with themselves at after L2 #1: {after['counters_disagree']} (vLLM's"
        " metrics path, not the drafter: that AL is void)"
    ]
    report = (folder / "report.md").read_text()
    assert "void" in report and "the spec-decode counters disagree with themselves" in report
    assert f"after L2 #1: AL void (the counters disagree: {after['counters_disagree']})" in proc.stderr


def test_extra_engines_are_summed(engine: FakeEngine, tmp_path: Path) -> None:
    single = run(engine, tmp_path, scenario_text(engine))[1]
    (tmp_path / "out").rename(tmp_path / "out-single")
    env = {"FAKE_VLLM_ARGS": "--engines 3"}  # requests spread round-robin over three engines' counters
    proc, folder = run(engine, tmp_path, scenario_text(engine, variants={"baseline": env}))
    assert proc.returncode == 0, proc.stderr
    one = baseline(tmp_path / "out-single" / single.name)["stages"]
    three = baseline(folder)["stages"]
    assert [s["num_drafts"] for s in three] == [s["num_drafts"] for s in one]
    assert [s["acceptance_length"] for s in three] == [s["acceptance_length"] for s in one]


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback (from `ip -4 -o addr`), or None."""
    try:
        text = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if "inet" in parts:
            address = parts[parts.index("inet") + 1].split("/")[0]
            if not address.startswith("127."):
                return address
    return None


def test_servers_are_reachable_on_loopback_only(engine: FakeEngine, tmp_path: Path) -> None:
    other = non_loopback_ipv4()
    if other is None:
        pytest.skip("this machine has no non-loopback IPv4 address to probe")
    env = {"FAKE_VLLM_ARGS": "--step-delay 0.2"}  # keep the server up for a few seconds
    probes: dict[str, bool] = {}

    def probe() -> None:
        while not engine.launched():
            time.sleep(0.05)
        port = int(engine.launched()[0].split("--port ")[1].split()[0])
        deadline = time.monotonic() + 20
        while "127.0.0.1" not in probes and time.monotonic() < deadline:
            probes.update({addr: _connects(addr, port) for addr in ("127.0.0.1", other)})
            if not probes["127.0.0.1"]:
                probes.clear()
                time.sleep(0.05)

    watcher = threading.Thread(target=probe)
    watcher.start()
    proc, _ = run(engine, tmp_path, scenario_text(engine, variants={"baseline": env}))
    watcher.join()
    assert proc.returncode == 0, proc.stderr
    assert probes == {"127.0.0.1": True, other: False}


def _connects(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def test_hf_token_reaches_the_server_but_no_file_specwake_writes(engine: FakeEngine, tmp_path: Path) -> None:
    token = "hf_SECRETsecret1234567890"
    secret_env = {"MY_API_KEY": "key-SECRET-0987"}
    text = scenario_text(engine, variants={"baseline": secret_env})
    proc, folder = run(engine, tmp_path, text, HF_TOKEN=token)
    assert proc.returncode == 0, proc.stderr
    launched = engine.launched()[0]
    assert f"hf_token_sha256={hashlib.sha256(token.encode()).hexdigest()}" in launched  # passed through
    written = [p for p in folder.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"result.json", "report.md", "stages.csv", "baseline.log"}
    for path in written:
        content = path.read_text(errors="replace")
        assert token not in content and "key-SECRET-0987" not in content, path
    assert "HF_TOKEN=***" in (folder / "logs" / "baseline.log").read_text()
    assert token not in proc.stdout + proc.stderr


def test_hf_token_absent_is_not_invented(engine: FakeEngine, tmp_path: Path) -> None:
    proc, _ = run(engine, tmp_path, scenario_text(engine))  # run_cli drops HF_TOKEN unless given
    assert proc.returncode == 0, proc.stderr
    assert "hf_token_sha256=- " in engine.launched()[0]


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_overlay_writes_only_inside_the_cache(engine: FakeEngine, tmp_path: Path) -> None:
    diff = engine.write_fix(tmp_path)
    before = _tree(engine.package)
    outside = sorted(p.name for p in tmp_path.iterdir())
    text = scenario_text(engine, variants={"baseline": {}, "patched": {}}, patch=str(diff))
    proc, folder = run(engine, tmp_path, text)
    assert proc.returncode == 0, proc.stderr
    assert _tree(engine.package) == before  # the installed package is never touched
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*outside, "s.toml", "out", "cache"])
    overlay = Path(json.loads((folder / "result.json").read_text())["variants"][1]["overlay"])
    assert overlay.is_relative_to(tmp_path / "cache")
    for link in overlay.rglob("*"):
        if link.is_symlink():
            assert Path(link.readlink()).is_relative_to(engine.package)
