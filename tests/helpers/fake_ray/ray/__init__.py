"""A fake of the Ray calls specwake's cluster probe makes (specwake/run/server/raycluster.py), for tests: put its folder
on PYTHONPATH. `init(address="auto")` joins the cluster FAKE_RAY_STATE describes, a JSON file {"total": GPUs,
"busy_probes": probes that still see some of them in use, "probes": probes so far}; without that variable there is
no cluster and it raises ConnectionError, as Ray's own does."""

from __future__ import annotations

import json
import os
from pathlib import Path

_state: dict[str, float] = {}


def init(address: str | None = None, **_: object) -> None:
    assert address == "auto", "the probe must join a running cluster, never start one"
    path = os.environ.get("FAKE_RAY_STATE")
    if not path:
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to")
    state = json.loads(Path(path).read_text())
    state["probes"] = state.get("probes", 0) + 1
    Path(path).write_text(json.dumps(state))
    _state.update(state)


def cluster_resources() -> dict[str, float]:
    return {"CPU": 64.0, "GPU": float(_state["total"])}


def available_resources() -> dict[str, float]:
    busy = _state["probes"] <= _state["busy_probes"]
    return {"CPU": 60.0, "GPU": float(_state["total"]) - (4.0 if busy else 0.0)}


def shutdown() -> None:
    _state.clear()
