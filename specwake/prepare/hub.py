"""Where a model lives before any server starts: a local folder, the local Hugging Face cache, or (when asked)
the Hub. Reads files only; never downloads weights. `config.json` tells which family a model belongs to.
`confirm_on_hub` is `check --online`: a repository id the Hub does not have is bad input (exit 2); a model neither
this machine nor the Hub can confirm is exit 3.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from specwake.errors import InfraError, ScenarioError

HUB_ENDPOINT = "https://huggingface.co"
HUB_TIMEOUT_S = 10.0
# What the Hub answers, as huggingface_hub reads it (utils/_http.py, hf_raise_for_status): a missing repository is
# HTTP 404, or 401 to a request without a valid token (the Hub does not say whether a private repository exists), both
# with X-Error-Code: RepoNotFound; a 401 whose X-Error-Message is this one is a bad token, not a missing repository.
BAD_TOKEN = "Invalid credentials in Authorization header"


def hub_endpoint() -> str:
    """The Hub to ask: HF_ENDPOINT when set (huggingface_hub's own variable, e.g. a mirror), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")


def hub_cache() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub finds it: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/…"""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    base = (
        Path(home).expanduser()
        if home
        else Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "huggingface"
    )
    return base / "hub"


# A Hub repository id as huggingface_hub validates one (utils/_validators.py, validate_repo_id): an optional namespace,
# then a name of letters, digits, '-', '_', '.' — a name alone is a legacy model id such as `gpt2`, which the Hub
# still serves.
_REPO_ID = re.compile(r"(?:[\w.-]+/)?[\w.-]{1,96}", re.ASCII)


def _looks_like_repo_id(ref: str) -> bool:
    return bool(_REPO_ID.fullmatch(ref)) and not ref.startswith((".", "-")) and ".." not in ref and "--" not in ref


def cached_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The snapshot folder of `repo_id` in the local hub cache (the one refs/main names, else the newest)."""
    if not _looks_like_repo_id(repo_id):
        return None
    repo = (cache or hub_cache()) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    main = repo / "refs" / "main"
    try:
        if main.is_file():
            named = snapshots / main.read_text().strip()
            if named.is_dir():
                return named
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def local_config(model: str, cache: Path | None = None) -> dict[str, Any] | None:
    """The model's config.json from a local folder or the local hub cache; None when neither has it."""
    folder = Path(model).expanduser()
    candidates = [folder] if folder.is_dir() else []
    snapshot = cached_snapshot(model, cache)
    if snapshot is not None:
        candidates.append(snapshot)
    for candidate in candidates:
        try:
            data = json.loads((candidate / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


Found = Literal["local", "hub", "missing", "unknown"]


@dataclass(frozen=True)
class Availability:
    model: str
    where: str  # "local folder" | "local hub cache" | "on the Hub …" | "not found locally …" | "does not exist …"
    found: Found = "local"  # missing: the Hub said it has no such repository; unknown: not asked, or no answer


def availability(model: str, *, online: bool = False, client: httpx.Client | None = None) -> Availability:
    """Whether `model` can be loaded offline, and with `online`, whether the Hub has it (a metadata request,
    HF_TOKEN sent when set)."""
    if Path(model).expanduser().is_dir():
        return Availability(model, "local folder")
    if cached_snapshot(model) is not None:
        return Availability(model, "local hub cache")
    if not online or not _looks_like_repo_id(model):
        return Availability(model, "not found locally" + ("" if online else " (--online asks the Hub)"), "unknown")
    token = os.environ.get("HF_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{hub_endpoint()}/api/models/{model}"
    own = client is None
    http = client or httpx.Client(timeout=HUB_TIMEOUT_S)
    try:
        answer = http.get(url, headers=headers, follow_redirects=True)  # a legacy id redirects to its namespace
    except httpx.HTTPError as exc:
        return Availability(
            model, f"not found locally; the Hub did not answer ({type(exc).__name__}: {url})", "unknown"
        )
    finally:
        if own:
            http.close()
    return _read_answer(model, answer)


def _read_answer(model: str, answer: httpx.Response) -> Availability:
    status, code = answer.status_code, answer.headers.get("X-Error-Code", "")
    if status == 200:
        return Availability(model, "on the Hub (not downloaded yet)", "hub")
    if status == 401 and answer.headers.get("X-Error-Message") == BAD_TOKEN:
        return Availability(
            model, "not found locally; the Hub refused HF_TOKEN (HTTP 401, invalid credentials)", "unknown"
        )
    if code == "GatedRepo" or status == 403:
        return Availability(model, f"on the Hub but gated: HTTP {status} (set HF_TOKEN with access)", "hub")
    if status in (401, 404) or code == "RepoNotFound":
        private = " (or is private, and HF_TOKEN does not reach it)" if status == 401 else ""
        return Availability(model, f"does not exist on the Hub{private}: HTTP {status} {code}".rstrip(), "missing")
    return Availability(model, f"not found locally; the Hub answered HTTP {status}", "unknown")


def confirm_on_hub(
    file: str, refs: Sequence[tuple[str, str]], *, client: httpx.Client | None = None
) -> list[Availability]:
    """`check --online` for one scenario file: where each (key, model) in `refs` is. A model the Hub says it does not
    have raises ScenarioError naming file and key (exit 2); one that neither this machine nor the Hub can confirm —
    the Hub does not answer, or the reference is no repository id to ask it about — raises InfraError (exit 3), as a
    Hub that cannot say: `--online` never ends "ok" on a model no server could load."""
    found = []
    for key, model in refs:
        where = availability(model, online=True, client=client)
        if where.found == "missing":
            raise ScenarioError(file, key, f"{model!r} {where.where}")
        if where.found == "unknown":
            why = where.where if _looks_like_repo_id(model) else "not found locally, and not a Hub repository id"
            raise InfraError(f"{file}: {key}: --online could not confirm {model!r}: {why}")
        found.append(where)
    return found
