"""Every failure class a variant can end with, and its meaning, in one place; plus the pure classification of
a server fault: the runner's view plus the server's log text become one named class.

GPU evidence (illegal memory access, a device-side assert, out of memory) wins, then a call across the ranks that
timed out, then a dead engine, then the runner's own class.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

CUDA_ILLEGAL_MEMORY_ACCESS = "cuda_illegal_memory_access"
CUDA_DEVICE_ASSERT = "cuda_device_assert"
CUDA_OOM = "cuda_oom"
COLLECTIVE_TIMEOUT = "collective_timeout"
ENGINE_DEAD = "engine_dead"
STARTUP_FAILED = "startup_failed"
REQUEST_TIMEOUT = "request_timeout"
STEP_FAILED = "step_failed"
SERVER_EXITED = "server_exited"
PORT_CONFLICT = "port_conflict"
OVERLAY_NOT_USED = "overlay_not_used"
INPUT_REJECTED = "input_rejected"
SPECWAKE_FAILED = "specwake_failed"

# Class → meaning. The first five are never vLLM's fault: outcome `error`, never `crash`. Three arise before anything
# is measured; input_rejected whenever the scenario asks for what the server refuses; specwake_failed whenever
# specwake's own code raised while it ran the variant.
MEANINGS: dict[str, str] = {
    STARTUP_FAILED: "the server never became ready",
    PORT_CONFLICT: "a foreign server answered on the port picked for ours; nothing was measured",
    OVERLAY_NOT_USED: "a worker imported vLLM from somewhere other than the variant's own (overlay or install)",
    INPUT_REJECTED: "the scenario's own input was refused (HTTP 4xx, e.g. a prompt longer than max_model_len, or a"
    " push_scale or push_skip entry that matches no tensor): a problem of the scenario, not a crash of vLLM",
    SPECWAKE_FAILED: "specwake's own code failed while it ran the variant (a bug of specwake's, never vLLM's fault; the"
    " variant's excerpt holds the traceback)",
    CUDA_ILLEGAL_MEMORY_ACCESS: "CUDA illegal memory access",
    CUDA_DEVICE_ASSERT: "a CUDA kernel's device-side assertion failed (e.g. an index out of bounds)",
    CUDA_OOM: "CUDA out of memory",
    COLLECTIVE_TIMEOUT: "a call across the ranks did not finish in time (vLLM's RPC to its workers, or an NCCL"
    " collective its watchdog timed out): a rank hung or died",
    ENGINE_DEAD: "the vLLM engine core died",
    REQUEST_TIMEOUT: "a request or cycle step did not answer before its deadline",
    STEP_FAILED: "a request or cycle step failed while the server stayed up",
    SERVER_EXITED: "the server process exited",
}
ERROR_CLASSES: tuple[str, ...] = (STARTUP_FAILED, PORT_CONFLICT, OVERLAY_NOT_USED, INPUT_REJECTED, SPECWAKE_FAILED)
# What `classify` can name (startup_failed included: a server that died while starting).
CRASH_CLASSES: tuple[str, ...] = (
    CUDA_ILLEGAL_MEMORY_ACCESS,
    CUDA_DEVICE_ASSERT,
    CUDA_OOM,
    COLLECTIVE_TIMEOUT,
    ENGINE_DEAD,
    STARTUP_FAILED,
    REQUEST_TIMEOUT,
    STEP_FAILED,
    SERVER_EXITED,
)
FAULT_CLASSES: tuple[str, ...] = (STARTUP_FAILED, REQUEST_TIMEOUT, STEP_FAILED, SERVER_EXITED)
STARTUP_PHASE = "startup"

Patterns = tuple[re.Pattern[str], ...]


def _compile(*sources: str) -> Patterns:
    return tuple(re.compile(s) for s in sources)


# What torch / CUDA / HIP / NCCL print for an illegal memory access (vLLM issue #55013 and many others):
# "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
# "Search for `cudaErrorIllegalAddress' in ...", NCCL's "Cuda failure 'an illegal memory access ...'".
# Comments in vLLM's sources say "illegal memory access" without "was encountered": never a match.
ILLEGAL_MEMORY_ACCESS: Patterns = _compile(
    r"illegal memory access was encountered",
    r"\bcudaErrorIllegalAddress\b",
    r"\bCUDA_ERROR_ILLEGAL_ADDRESS\b",
    r"\bhipErrorIllegalAddress\b",
)

# A kernel's assert(): torch prints "CUDA error: device-side assert triggered" (with "Search for `cudaErrorAssert'"),
# and the kernel itself "…IndexKernel.cu:111: operator(): block: [3,0,0], thread: [64,0,0] Assertion `…` failed.".
DEVICE_ASSERT: Patterns = _compile(
    r"device-side assert(?:ion)? triggered",
    r"\bcudaErrorAssert\b",
    r"\bCUDA_ERROR_ASSERT\b",
    r"\bhipErrorAssert\b",
    r"\.cu:\d+: .*block: \[[\d,]+\], thread: \[[\d,]+\] Assertion `.*` failed",
)

# A call across the ranks that never came back. vLLM's executor: `TimeoutError(f"RPC call to {method} timed out.")`
# (v1/executor/multiproc_executor.py, 0.32/0.33, when /collective_rpc's timeout passes); PyTorch's NCCL watchdog:
# "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=…, OpType=ALLREDUCE, …) ran for 600061
# milliseconds before timing out." and "[Rank 1] Some NCCL operations have failed or timed out. …".
COLLECTIVE_TIMEOUTS: Patterns = _compile(
    r"RPC call to \S+ timed out",
    r"Watchdog caught collective operation timeout",
    r"Some NCCL operations have failed or timed out",
)

# An allocation that failed: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...",
# "OutOfMemoryError('CUDA out of memory ...')", vLLM's own "CUDA out of memory occurred when warming up
# sampler ..." and "Failed to load model - not enough GPU memory". Advice such as "If you are running out
# of memory, consider decreasing `gpu_memory_utilization`", "... to avoid OOM" or "This may cause
# out-of-memory errors." names no failed allocation and must not match; neither does `except
# torch.cuda.OutOfMemoryError as e:` echoed in a traceback (no ':' or '(' right after the name).
# vLLM's cumem allocator failing while waking up prints "CUDA Error: out of memory at …cumem_allocator.cpp:163"
# (0.33; the line differs between builds), torch's runtime "CUDA error: out of memory", NCCL "Cuda failure
# 'out of memory'" or "Cuda failure 2 'out of memory'" (with NCCL_DEBUG ≥ WARN). Case does not matter.
OUT_OF_MEMORY: Patterns = (
    *_compile(
        r"\bOutOfMemoryError\b\s*[:(]",
        r"\b(?:CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|hipErrorOutOfMemory)\b",
        r"Failed to load model - not enough GPU memory",
    ),
    re.compile(r"\b(?:CUDA|HIP) out of memory\b", re.IGNORECASE),
    re.compile(r"\bCUDA error: out of memory\b", re.IGNORECASE),
    re.compile(r"\bCuda failure (?:\d+ )?'out of memory'", re.IGNORECASE),
)

# The engine core (or a worker under it) is gone. vLLM 0.32/0.33 print "EngineCore encountered a fatal
# error.", "[shutdown] MPClient: engine core exited unexpectedly", "Worker proc ... died unexpectedly";
# requests then fail with EngineDeadError. Older releases: "Engine core proc EngineCore_DP0 died
# unexpectedly, shutting down client." and V0's MQEngineDeadError / "Engine loop is not running".
ENGINE_DEATH: Patterns = _compile(
    r"\bEngineDeadError\b",
    r"EngineCore encountered (?:a fatal error|an issue)",
    r"engine core exited unexpectedly",
    r"\bEngine core proc(?:ess)? \S+ died unexpectedly",
    r"\b(?:Ray)?Worker ?[Pp]roc\b.*died unexpectedly",
    r"Engine loop is not running",
)

# Where a server has finished starting: uvicorn's line, else vLLM's "Starting vLLM (API) server on".
READY_MARKERS: Patterns = _compile(
    r"Application startup complete",
    r"Starting vLLM (?:API )?server\b.* on https?://",
)

# A shutdown we asked for (SIGTERM/SIGINT). From here on vLLM 0.32 logs teardown noise, including an
# EngineDeadError traceback from the output handler, even on a clean stop: never evidence of a crash.
SIGNAL_SHUTDOWN_MARKERS: Patterns = _compile(
    r"\[shutdown\] API server: shutdown triggered",
    r"\[shutdown\] EngineCore: trigger received signal",
    r"\[shutdown\] WorkerProc: terminated by shutdown signal",
)

# A vLLM log line below ERROR: "(EngineCore pid=7) WARNING 11-29 17:59:14 [file.py:12] ...". Such lines carry
# advice ("... to avoid OOM") and recovered faults; they never count as out-of-memory or fallback evidence.
CHATTER_LINE = re.compile(r"^\s*(?:\([^)]*\)\s+)?(?:DEBUG|INFO|WARNING)\s+\d\d-\d\d\s")
# vLLM's prefix of any log line: "(EngineCore pid=7) ERROR 11-29 17:59:14 [file.py:12] ".
CHATTER_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(?:[A-Z]+\s+\d\d-\d\d\s+[\d:]+\s+\[[^\]]*\]\s*)?")

# For the fallback classes: the lines most likely to say what went wrong (exception announcements).
ERROR_LINES: Patterns = _compile(
    r"\b[A-Z]\w*(?:Error|Exception)\b: ",
    r"\b(?:CUDA|HIP|NCCL) error\b",
    r"\bdied (?:unexpectedly|with exit code)",
)
# The line that announces an exception: "AssertionError", "(Worker pid=9) ERROR ... ValueError: bad shape". A bare
# name counts too (`assert` without a message prints only "AssertionError").
EXCEPTION_LINE = re.compile(r"(?<![\w.])((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))(?::\s.*)?$")


@dataclass(frozen=True)
class Crash:
    """A classified server fault, ready for a VariantResult."""

    cls: str  # one of CRASH_CLASSES
    lines: tuple[str, ...]  # up to ~5 first matching log lines (stripped), for the report
    reason: str  # one human line
    first_error: str | None = None  # the first exception the server (or a worker) announced, as it printed it


def first_matching_lines(log_text: str, patterns: Iterable[re.Pattern[str]], limit: int = 5) -> tuple[str, ...]:
    """The first ``limit`` distinct lines (stripped, in log order) that match any of ``patterns``."""
    compiled = tuple(patterns)
    found: list[str] = []
    for raw in log_text.splitlines():
        line = raw.strip()
        if line and line not in found and any(p.search(line) for p in compiled):
            found.append(line)
            if len(found) >= limit:
                break
    return tuple(found)


def drop_chatter(log_text: str) -> str:
    """``log_text`` without the vLLM log lines below ERROR level (see CHATTER_LINE)."""
    return "\n".join(line for line in log_text.splitlines() if not CHATTER_LINE.match(line))


def _first_index(lines: list[str], patterns: Patterns) -> int | None:
    return next((i for i, line in enumerate(lines) if any(p.search(line) for p in patterns)), None)


# pydantic's announcement, whose reason is on the lines after it: "ValidationError: 1 validation error for
# SpeculativeConfig" then "  Value error, Invalid repository ID or local directory specified: '…'." (a field-level
# error puts the field's name on a line of its own first).
VALIDATION_ERROR = re.compile(r"\d+ validation errors? for \w+$")
PYDANTIC_REASON = re.compile(r"^\s+(?:Value error, |Assertion failed, )?(?P<reason>\S.*)$")


def first_exception(text: str) -> str | None:
    """The first line of `text` that announces an exception (stripped of vLLM's log prefix; its DEBUG, INFO and WARNING
    lines, which quote exceptions as advice, never count), or None. For a pydantic
    ValidationError, whose announcement names only the class, the reason from the next lines is quoted after it."""
    lines = [CHATTER_PREFIX.sub("", raw.rstrip()) for raw in drop_chatter(text).splitlines()]
    for index, line in enumerate(lines):
        stripped = line.strip()
        match = EXCEPTION_LINE.search(stripped)
        if match and not stripped.startswith(("File ", "raise ", "except ")):
            announced = stripped[match.start() :]
            reason = _validation_reason(lines[index + 1 : index + 4]) if VALIDATION_ERROR.search(announced) else None
            return f"{announced} — {reason}" if reason else announced
    return None


def _validation_reason(following: list[str]) -> str | None:
    for line in following:
        found = PYDANTIC_REASON.match(line)
        if found and " " in found.group("reason").strip():  # a field's name alone is not the reason
            return found.group("reason").strip()
    return None


def relevant_log(log_text: str, phase: str) -> str:
    """The part of the log that can explain a fault in ``phase``.

    Always ends before a signal-triggered shutdown (teardown noise). After startup it also begins at the
    ready marker, so warnings printed while starting cannot be mistaken for a crash after the cycle.
    """
    lines = log_text.splitlines()
    start = 0
    if phase != STARTUP_PHASE:
        ready = _first_index(lines, READY_MARKERS)
        start = ready + 1 if ready is not None else 0
    end = _first_index(lines[start:], SIGNAL_SHUTDOWN_MARKERS)
    stop = start + end if end is not None else len(lines)
    return "\n".join(lines[start:stop])


def _reason(cls: str, phase: str, fault_class: str, server_alive: bool) -> str:
    where = f" during {phase}" if phase else ""
    text = MEANINGS[cls] + where
    if cls != fault_class and fault_class in MEANINGS:
        text += f" (seen as {fault_class.replace('_', ' ')})"
    if not server_alive and cls not in (SERVER_EXITED, STARTUP_FAILED):
        text += "; the server process is gone"
    return text


def classify(*, fault_class: str, log_text: str, phase: str, server_alive: bool, message: str = "") -> Crash:
    """Name a server fault from what the runner saw and what the server logged.

    ``fault_class`` is the runner's view (one of FAULT_CLASSES); ``message`` is its error text (for a
    failed step, the HTTP body with the worker's exception), scanned together with the log. A specific
    GPU failure in the evidence wins; then a dead engine (after startup only: an engine that dies while
    starting is what startup_failed means); then ``server_exited`` if the process is gone; else the
    fault class. Raises ValueError on an unknown fault class.
    """
    if fault_class not in FAULT_CLASSES:
        raise ValueError(f"unknown fault class {fault_class!r} (expected one of {', '.join(FAULT_CLASSES)})")
    evidence = "\n".join(part for part in (relevant_log(log_text, phase), message) if part)
    errors_only = drop_chatter(evidence)
    candidates: list[tuple[str, Patterns, str]] = [
        (CUDA_ILLEGAL_MEMORY_ACCESS, ILLEGAL_MEMORY_ACCESS, evidence),
        (CUDA_DEVICE_ASSERT, DEVICE_ASSERT, evidence),
        (CUDA_OOM, OUT_OF_MEMORY, errors_only),
        (COLLECTIVE_TIMEOUT, COLLECTIVE_TIMEOUTS, errors_only),
    ]
    if phase != STARTUP_PHASE and fault_class != STARTUP_FAILED:
        candidates.append((ENGINE_DEAD, ENGINE_DEATH, evidence))
    first_error = first_exception(relevant_log(log_text, phase)) or first_exception(message)
    for cls, patterns, text in candidates:
        lines = first_matching_lines(text, patterns)
        if lines:
            return Crash(cls, lines, _reason(cls, phase, fault_class, server_alive), first_error)
    cls = fault_class
    if not server_alive and fault_class in (STEP_FAILED, REQUEST_TIMEOUT):
        cls = SERVER_EXITED
    lines = first_matching_lines(errors_only, ERROR_LINES)
    return Crash(cls, lines, _reason(cls, phase, fault_class, server_alive), first_error)
