"""What a scenario's `server.args`, a variant's `args` and their `env` tables may say: a list of words, none of the
flags specwake sets itself, string values. The checks run as pydantic validators of the scenario file's models
(specwake.prepare.scenario_file)."""

from __future__ import annotations

from typing import Any

# Flags specwake sets itself; a scenario's `server.args` may not override them.
RESERVED_FLAGS = {
    "--host": "servers bind to 127.0.0.1 only",
    "--port": "specwake picks a free port per server",
    "--worker-extension-cls": "specwake's worker extension is required for info and discard",
    "--speculative-config": "use the [speculative] table",
    "-sc": "use the [speculative] table",  # vLLM's alias of --speculative-config
    "--model": "use server.model",
    "--tensor-parallel-size": "use server.tensor_parallel_size or --tp",
    "-tp": "use server.tensor_parallel_size or --tp",
    "--data-parallel-size": "use server.data_parallel_size",
    "-dp": "use server.data_parallel_size",
    "--enable-expert-parallel": "use server.enable_expert_parallel",
    "-ep": "use server.enable_expert_parallel",
    **dict.fromkeys(
        ("--headless", "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port"), "use server.nodes"
    ),
    # one server per engine, each told its rank and where the group meets: server.load_balancing
    **dict.fromkeys(
        (
            "--data-parallel-rank",
            "-dpn",
            "--data-parallel-external-lb",
            "-dpe",
            "--data-parallel-hybrid-lb",
            "-dph",
            "--data-parallel-start-rank",
            "-dpr",
            "--data-parallel-size-local",
            "-dpl",
            "--data-parallel-address",
            "-dpa",
            "--data-parallel-rpc-port",
            "-dpp",
        ),
        "use server.load_balancing",
    ),
    "--enable-sleep-mode": "specwake enables sleep mode where the platform supports it",
}


def args_is_list(value: Any) -> Any:
    if isinstance(value, str):
        raise ValueError('must be a list of strings, not one shell string (e.g. ["--seed", "0"])')
    return value


SPECULATIVE_FLAGS = ("--speculative-config", "-sc")


def as_vllm_reads(flag: str) -> str:
    """A flag's name as vLLM's parser reads it (FlexibleArgumentParser.parse_args): a long flag's underscores up to
    its first '.' become dashes (`--speculative_config.k` is `--speculative-config.k`)."""
    if not flag.startswith("--"):
        return flag
    name, dot, rest = flag.partition(".")
    return name.replace("_", "-") + dot + rest


def no_reserved_flags(value: list[str]) -> list[str]:
    """No flag specwake sets itself, in any spelling vLLM's parser reads as it. A dotted `--speculative-config.KEY`
    (or `-sc.KEY`) is refused too: vLLM's parser gathers dotted keys into a `--speculative-config` of their own, given
    after specwake's, which replaces the [speculative] table whole (model and method included)."""
    for arg in value:
        written = arg.split("=", 1)[0]
        flag = as_vllm_reads(written)
        base, dot, key = flag.partition(".")
        if dot and base in SPECULATIVE_FLAGS:
            raise ValueError(
                f"{written!r} would replace specwake's whole --speculative-config (vLLM's parser makes its dotted"
                f" keys a speculative config of their own); set {key} under [speculative] instead"
            )
        if flag in RESERVED_FLAGS:
            raise ValueError(f"{written!r} is set by specwake ({RESERVED_FLAGS[flag]})")
    return value


def env_values_are_strings(value: Any) -> Any:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(item, str):
                raise ValueError(f"value of {key!r} must be a string, got {type(item).__name__}")
    return value
