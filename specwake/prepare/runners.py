"""vLLM's model runners, as specwake names them in `check`, results and reports: which one a server runs ("v1" or
"v2", as its workers answer), and how (on a CPU, Model Runner V2's Triton programs run in Triton's interpreter:
specwake/worker/triton_cpu.py).
"""

from __future__ import annotations

NAMES = {"v1": "Model Runner V1", "v2": "Model Runner V2"}
INTERPRETED = "Triton kernels interpreted on CPU"


def runner_label(runner: str | None, platform: str | None) -> str | None:
    """The label of a runner: "Model Runner V2 (Triton kernels interpreted on CPU)", "Model Runner V2", "Model Runner
    V1"; None where the runner is not known (no worker answered, or a result of specwake before runners were
    recorded)."""
    if runner not in NAMES:
        return None
    name = NAMES[runner]
    return f"{name} ({INTERPRETED})" if runner == "v2" and platform == "cpu" else name


def runner_choice(asked: str | None, answered: str | None, platform: str | None) -> str:
    """What `check` says of a variant's runner: the one vLLM's own config chose for it (`answered`), and whether it was
    asked for (`asked`: the variant's model_runner) or is vLLM's own choice."""
    how = f'model_runner = "{asked}"' if asked else "vLLM's choice for this release and configuration"
    label = runner_label(answered, platform)
    if label is None:
        return f"{NAMES.get(asked or '', 'not known until the server starts')} — {how}; vLLM could not check it here"
    return f"{label} — {how}"
