"""Model lookup before launch: local folders, the local Hugging Face cache layout, the Hub (MockTransport), and the
GPU-only drafter families that `check` names on a CPU machine."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from specwake.errors import InfraError, ScenarioError
from specwake.prepare.engine import EngineInfo
from specwake.prepare.hub import availability, cached_snapshot, confirm_on_hub, local_config
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


def hub_like(seen: list[httpx.Request] | None = None) -> httpx.Client:
    """A client whose transport answers as the Hub's model API does (what huggingface_hub's hf_raise_for_status
    reads): 200 with the model's metadata; a missing repository 404 with X-Error-Code RepoNotFound when a token is
    sent, 401 with the same code without one; a bad token 401 with X-Error-Message naming it; 403 GatedRepo."""

    def answer(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        repo = request.url.path.split("/api/models/", 1)[1]
        token = request.headers.get("authorization")
        if token == "Bearer hf_revoked":
            return httpx.Response(401, headers={"X-Error-Message": "Invalid credentials in Authorization header"})
        if repo == "org/remote":
            return httpx.Response(200, json={"id": repo, "modelId": repo, "private": False})
        if repo == "org/gated":
            return httpx.Response(403, headers={"X-Error-Code": "GatedRepo"})
        missing = {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
        return httpx.Response(404 if token else 401, headers=missing, json={"error": "Repository not found"})

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_availability_offline_and_online(hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache_with(hub, "org/cached", {})
    assert availability("org/cached").where == "local hub cache"
    assert availability("org/remote").where == "not found locally (--online asks the Hub)"
    seen: list[httpx.Request] = []
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    client = hub_like(seen)
    found = availability("org/remote", online=True, client=client)
    assert (found.found, found.where) == ("hub", "on the Hub (not downloaded yet)")
    assert availability("org/gated", online=True, client=client).found == "hub"
    typo = availability("org/typo", online=True, client=client)
    assert (typo.found, typo.where) == ("missing", "does not exist on the Hub: HTTP 404 RepoNotFound")
    assert seen[0].headers["authorization"] == "Bearer hf_secret"
    assert str(seen[0].url) == "https://huggingface.co/api/models/org/remote"
    monkeypatch.delenv("HF_TOKEN")  # without a token the Hub answers 401 for a repository it does not show
    assert availability("org/typo", online=True, client=client).found == "missing"
    monkeypatch.setenv("HF_TOKEN", "hf_revoked")  # a bad token says nothing about the repository
    assert availability("org/typo", online=True, client=client).found == "unknown"


def test_hf_endpoint_names_the_hub_to_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.org/")
    availability("org/remote", online=True, client=hub_like(seen))
    assert str(seen[0].url) == "https://hub.example.org/api/models/org/remote"


def test_check_online_refuses_an_id_the_hub_does_not_have(hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    refs = [("server.model", "org/remote"), ("speculative.model", "org/typo")]
    with pytest.raises(ScenarioError) as info:
        confirm_on_hub("scenarios/s.toml", refs, client=hub_like())
    assert info.value.exit_code == 2 and (info.value.file, info.value.key) == ("scenarios/s.toml", "speculative.model")
    assert str(info.value) == (
        "scenarios/s.toml: speculative.model: 'org/typo' does not exist on the Hub (or is private, and HF_TOKEN does"
        " not reach it): HTTP 401 RepoNotFound"
    )
    assert [a.found for a in confirm_on_hub("s.toml", refs[:1], client=hub_like())] == ["hub"]


def test_check_online_does_not_pass_when_the_hub_does_not_answer(hub: Path) -> None:
    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no route to host", request=request)

    client = httpx.Client(transport=httpx.MockTransport(unreachable))
    with pytest.raises(InfraError) as info:
        confirm_on_hub("s.toml", [("server.model", "org/remote")], client=client)
    assert info.value.exit_code == 3 and "s.toml: server.model: --online could not confirm 'org/remote'" in str(
        info.value
    )
    assert "ConnectError" in str(info.value)


def scenario(tmp_path: Path, method: str, model: str):  # noqa: ANN201
    path = tmp_path / "s.toml"
    path.write_text(f'[server]\nmodel = "{model}"\n[speculative]\nmethod = "{method}"\n')
    return load_scenario(path)


def test_a_v2_only_family_runs_on_cpu(tmp_path: Path, hub: Path) -> None:
    """DSpark exists only in Model Runner V2, which a CPU server runs with Triton interpreted (worker/triton_cpu.py);
    a DSpark scenario that asks for V1 is vLLM's to refuse (tests/e2e/test_validate.py)."""
    dspark = scenario(tmp_path, "dspark", "Qwen/Qwen3-4B-FP8")
    assert gpu_only_family(dspark, "Qwen/Qwen3-4B-FP8") is None
    assert platform_problem(dspark, CPU, None) is None
    plain = scenario(tmp_path, "mtp", "org/unknown")  # no config at hand: no claim either way
    assert gpu_only_family(plain, "org/unknown") is None


def test_a_hybrid_runs_on_cpu_on_model_runner_v2_and_not_on_v1(tmp_path: Path, hub: Path) -> None:
    """V2 (vLLM's choice on CPU too) interprets the Triton programs that copy its Mamba states; V1 has no Triton."""
    cache_with(hub, "Qwen/Qwen3.5-0.8B-Base", {"model_type": "qwen3_5"})
    hybrid = scenario(tmp_path, "mtp", "Qwen/Qwen3.5-0.8B-Base")
    assert gpu_only_family(hybrid, "Qwen/Qwen3.5-0.8B-Base") is None
    assert platform_problem(hybrid, CPU, None) is None
    path = tmp_path / "v1.toml"
    path.write_text('[server]\nmodel = "Qwen/Qwen3.5-0.8B-Base"\nmodel_runner = "v1"\n[speculative]\nmethod = "mtp"\n')
    assert "hybrid linear-attention MTP" in (platform_problem(load_scenario(path), CPU, None) or "")


def test_check_online_never_passes_a_model_nobody_can_confirm(hub: Path) -> None:
    """A reference that is neither on this machine nor a repository id the Hub could be asked about is exit 3 (no
    request is sent); a legacy id without a namespace is asked like any other."""

    def unasked(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"asked the Hub about {request.url}")

    with pytest.raises(InfraError) as info:
        confirm_on_hub(
            "s.toml", [("server.model", "my model")], client=httpx.Client(transport=httpx.MockTransport(unasked))
        )
    assert (
        str(info.value)
        == "s.toml: server.model: --online could not confirm 'my model': not found locally, and not a Hub repository id"
    )
    seen: list[httpx.Request] = []
    with pytest.raises(ScenarioError, match="'gpt2' does not exist on the Hub"):
        confirm_on_hub("s.toml", [("server.model", "gpt2")], client=hub_like(seen))
    assert str(seen[0].url) == "https://huggingface.co/api/models/gpt2"
