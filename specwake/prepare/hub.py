"""Where a model lives before any server starts: a local folder, the local Hugging Face cache, or (when asked)
the Hub. Reads files only; never downloads weights. `config.json` tells which family a model belongs to.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HUB_API = "https://huggingface.co/api/models/"
HUB_TIMEOUT_S = 10.0


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


def _looks_like_repo_id(ref: str) -> bool:
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not ref.startswith((".", "/", "~"))


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


@dataclass(frozen=True)
class Availability:
    model: str
    where: str  # "local folder" | "local hub cache" | "on the Hub" | "not found locally" | "not on the Hub: …"


def availability(model: str, *, online: bool = False, client: httpx.Client | None = None) -> Availability:
    """Whether `model` can be loaded offline, and with `online`, whether the Hub has it (a HEAD-like metadata
    request, HF_TOKEN sent when set: gated repositories answer 401/403 without it)."""
    if Path(model).expanduser().is_dir():
        return Availability(model, "local folder")
    if cached_snapshot(model) is not None:
        return Availability(model, "local hub cache")
    if not online or not _looks_like_repo_id(model):
        return Availability(model, "not found locally" + ("" if online else " (--online asks the Hub)"))
    token = os.environ.get("HF_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    http = client or httpx.Client(timeout=HUB_TIMEOUT_S)
    try:
        answer = http.get(HUB_API + model, headers=headers)
    except httpx.HTTPError as exc:
        return Availability(model, f"not found locally; the Hub did not answer ({type(exc).__name__})")
    finally:
        if own:
            http.close()
    if answer.status_code == 200:
        return Availability(model, "on the Hub (not downloaded yet)")
    if answer.status_code in (401, 403):
        return Availability(model, f"on the Hub but gated: HTTP {answer.status_code} (set HF_TOKEN with access)")
    return Availability(model, f"not on the Hub: HTTP {answer.status_code}")
