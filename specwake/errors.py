"""The one exception tree of specwake; each class carries the exit code the CLI returns for it.

SpecwakeError                      (base, never raised directly)
├── InputError            exit 2   bad scenario, flag, patch or results file; nothing launched
│   ├── ScenarioError              a scenario file or override is invalid (file: key: reason)
│   ├── ScenarioErrors             several files invalid (`check a.toml b.toml`): one ScenarioError per file
│   └── PatchError                 a diff is malformed, escapes the package, or does not apply
├── InfraError            exit 3   the machine cannot run what was asked
│   ├── EngineMissing              vLLM is not importable in the variant's interpreter
│   ├── StartupFailed              a server exited or never became ready (log tail attached)
│   ├── PlatformMismatch           e.g. real L2 sleep on a CPU build, more TP ranks than GPUs, weights no GPU holds
│   └── ResultsUnwritable          the results folder cannot be created or written
├── ServerFault                    a running server failed us (becomes a `crash` outcome)
│   ├── RequestFailed              a request or cycle step answered non-2xx or broke the connection
│   │   └── InputRejected          the server refused the scenario's own input (HTTP 4xx on a request, a
│   │                              push_scale / push_skip entry that matches nothing): `error`, not vLLM's crash
│   └── RequestTimeout             a request or cycle step did not answer before its deadline
└── Interrupted           exit 130 SIGINT / SIGTERM reached specwake
"""

from __future__ import annotations

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_INPUT = 2
EXIT_INFRA = 3
EXIT_INTERRUPTED = 130


class SpecwakeError(Exception):
    """Base of every error specwake raises on purpose."""

    exit_code = EXIT_INFRA


class InputError(SpecwakeError):
    exit_code = EXIT_INPUT


class ScenarioError(InputError):
    """A scenario problem, rendered as one line: ``file: key.path: reason``."""

    def __init__(self, file: str, key: str, reason: str) -> None:
        self.file, self.key, self.reason = file, key, reason
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {reason}")


class ScenarioErrors(InputError):
    """The first problem of each of several scenario files, rendered as one line each."""

    def __init__(self, errors: list[ScenarioError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class PatchError(InputError):
    pass


class InfraError(SpecwakeError):
    exit_code = EXIT_INFRA


class EngineMissing(InfraError):
    pass


class StartupFailed(InfraError):
    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(message)


class PlatformMismatch(InfraError):
    """E.g. real L2 sleep asked on a CPU build, more tensor-parallel ranks than GPUs, or weights that cannot fit the
    GPUs' memory (specwake.prepare.memory)."""


class ResultsUnwritable(InfraError):
    pass


class ServerFault(SpecwakeError):
    """A fault of a running server; the runner turns it into a `crash` outcome."""

    crash_class = "server_exited"


class RequestFailed(ServerFault):
    crash_class = "step_failed"


class InputRejected(RequestFailed):
    """The scenario asked for what the server refuses as bad input; found only once running (check finds most)."""

    crash_class = "input_rejected"


class RequestTimeout(ServerFault):
    crash_class = "request_timeout"


class Interrupted(SpecwakeError):
    exit_code = EXIT_INTERRUPTED
