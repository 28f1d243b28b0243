"""A stand-in for a vLLM OpenAI API server (stdlib only) with faults on demand, for tests.

Usage: python tests/helpers/fake_server.py --port P [--mode MODE] [options]

Endpoints (as vLLM 0.32 with VLLM_SERVER_DEV_MODE=1): GET /health, /v1/models, /metrics,
/is_sleeping; POST /v1/completions, /sleep?level=N, /wake_up?tags=..., /collective_rpc,
/reset_prefix_cache.

Counters, completions (streamed when asked, with logprobs and usage) and the prefix cache follow
tests/helpers/vllm_model.py: every completion of N tokens is decoded in D = round(N / AL) draft steps of K draft
tokens each, one streamed chunk per step after --step-delay seconds. AL is --al-fresh until the weights are discarded
(sleep level 2 or the collective_rpc method specwake_emulate_discard), --al-after from then on. The target is
"zeroed" from the discard until reload_weights: completions then return garbage ("!"), as a model with zero weights
would. While asleep (until every tag is woken) completions answer 503.

Modes:
  ready            (default) answer normally
  never-ready      listen, but GET /health answers 503 forever
  slow-start       wait --startup-delay seconds (default 2) before listening
  exit-early       print a vLLM-like startup traceback to stderr and exit with code 1
  crash-on-reload  on collective_rpc reload_weights print "CUDA error: an illegal memory access
                   was encountered" to stderr and die (os._exit(1))
  hang-on-request  completions hang forever once the weights have been discarded (fresh ones answer)
  engine-dead-after-discard
                   the first completion after the discard prints vLLM-like engine-death lines (a worker
                   killed, EngineDeadError) to stderr and answers 500; from then on every completion
                   answers 500 and GET /health 503, the process stays up (like VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)
  oom-on-wake      POST /wake_up?tags=kv_cache prints a torch.OutOfMemoryError line to stderr, answers 500
Other faults: --spawn-child (a child process in the same group, like EngineCore),
--ignore-sigterm (server and child ignore SIGTERM), --child-ignore-sigterm (only the child does),
--fault WHEN:ACTION (repeatable) with WHEN one of startup, completion:N (the N-th completion request,
warmup included), path:/sleep (any POST path), rpc:METHOD, and ACTION one of kill-group / stop-group
(SIGKILL / SIGSTOP this server's own process group), int-parent / term-parent (SIGINT / SIGTERM to the
process that launched us, i.e. specwake); --no-spec-metrics (speculation silently off: no spec-decode
families), --reset-counters-at N (every counter restarts from 0 at the N-th completion, like a restarted engine),
--phantom-accepted (once the weights are discarded, the accepted-tokens total counts what the fresh drafter would have
accepted over the drafts made, while drafts and the per-position counts say what was really drafted: a metrics path
that reports accepted tokens it never drafted, which reads a dead drafter's AL as fresh),
--draft-discard-warning (the first sleep at level 2 logs vLLM 0.34's warning that it discards the drafter's weights),
--load-seconds S (logs vLLM's "Model loading took … and S seconds" before it listens, and uvicorn's startup line once
it does), --reload-delay S (each reload_weights takes S seconds longer).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from vllm_model import DONE, ServerModel, chunk_event, usage  # a sibling: tests/ is on sys.path when this runs

MODES = (
    "ready",
    "never-ready",
    "slow-start",
    "exit-early",
    "crash-on-reload",
    "hang-on-request",
    "engine-dead-after-discard",
    "oom-on-wake",
)
FAULT_ACTIONS = {
    "kill-group": ("group", signal.SIGKILL),
    "stop-group": ("group", signal.SIGSTOP),
    "int-parent": ("parent", signal.SIGINT),
    "term-parent": ("parent", signal.SIGTERM),
}
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
TAGS = ("weights", "kv_cache")
# vLLM 0.34's warning on a Level 2 sleep (vllm/v1/worker/gpu_worker.py:309-317, warning_once), as a worker logs it
DRAFT_DISCARD_WARNING = (
    "(Worker pid={pid}) WARNING 11-30 02:17:00 [gpu_worker.py:309] Level 2 sleep discards draft model weights;"
    " reload_weights restores only the target. Unless the draft is updated separately, set"
    " --sleep-preserve-parameter-names 'draft.*' to keep them."
)


class State:
    """Everything the fake engine remembers; guarded by one lock. Counters, completions and the prefix cache are
    tests/helpers/vllm_model.py's, shared with the in-process mock."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.asleep: set[str] = set()
        self.engine_dead = False
        self.warned = False  # the draft discard warning, logged once (warning_once)
        self.completions = 0  # completion requests received, for --fault completion:N
        self.vllm = ServerModel(
            model=args.model,
            k=args.k,
            engines=args.engines,
            al_fresh=args.al_fresh,
            al_after=args.al_after,
            prefix_cache=not args.no_prefix_cache,
            stale_prefix_cache=args.stale_prefix_cache,
            phantom_accepted=args.phantom_accepted,
        )


def fingerprint(tensors: int, differ: bool) -> dict[str, object]:
    """The worker extension's answer shape (specwake/worker/extension.py), compared with fresh."""
    changed = tensors if differ else 0
    return {
        "present": True, "class": "Fake", "tensors": tensors, "numel": tensors * 8, "all_zero": changed,
        "on_meta": 0, "empty": 0, "shared_with_target": 0, "nonfinite": 0, "packed": 0, "packed_discarded": 0,
        "abs_sum": 0.0 if differ else 12.5, "compared": tensors, "differ": changed, "differ_names": [],
    }  # fmt: skip


def parse_fault(text: str) -> tuple[str, str]:
    """`WHEN:ACTION` → (when, action); raises ValueError for an unknown action."""
    when, _, action = text.rpartition(":")
    if not when or action not in FAULT_ACTIONS:
        raise ValueError(f"bad --fault {text!r}: want WHEN:ACTION with ACTION in {', '.join(FAULT_ACTIONS)}")
    return when, action


def fire_faults(faults: list[tuple[str, str]], event: str) -> None:
    """Deliver every fault registered for `event` (a stop or kill of our own group does not return)."""
    for when, action in faults:
        if when != event:
            continue
        target, sig = FAULT_ACTIONS[action]
        print(f"INFO: fault injected at {event}: {action} t={time.time():.3f}", flush=True)
        if target == "group":
            os.killpg(os.getpgrp(), sig)
            time.sleep(3600)  # the signal may take effect a moment later: this request must never answer
        else:
            os.kill(os.getppid(), sig)
            time.sleep(1.0)  # keep the request open so the signal lands while specwake waits on it


CHECKPOINT = ("model.embed_tokens.weight", "lm_head.weight")  # the fake checkpoint's tensor names


def rpc_result(state: State, method: str, kwargs: dict) -> object:
    """The per-worker result of a collective_rpc method (caller holds the lock)."""
    if method == "specwake_transfer_manifest":  # what a push or sync sends each model: the whole fake checkpoint
        return [{"role": kwargs.get("role", "target"), "file": "/fake/model.safetensors", "names": list(CHECKPOINT)}]
    if method == "specwake_push":  # the worker extension's answer: what it scaled and left out, as the CLI chose
        request = json.loads(kwargs.get("request") or "{}")
        chosen = [c for c in (request.get("chosen") or {}).values() if isinstance(c, dict)]
        scaled = {n for c in chosen for n in c.get("scale") or {}}
        skipped = {n for c in chosen for n in c.get("skip") or []}
        state.vllm.reload(draft_too="draft" in (request.get("to") or []))  # the fake applies no scale: as fresh
        return {
            "pushed": dict.fromkeys(request.get("to") or ["target"], "pushed"),
            "scaled": sorted(scaled & set(CHECKPOINT)),
            "unmatched": sorted((scaled | skipped) - set(CHECKPOINT)),
            "skipped": sorted(skipped & set(CHECKPOINT)),
        }
    if method == "reload_weights":
        if state.args.mode == "crash-on-reload":
            print("CUDA error: an illegal memory access was encountered", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        time.sleep(state.args.reload_delay)
        state.vllm.reload()
        return None
    if method == "specwake_emulate_discard":
        state.vllm.discard()
        counts = {"parameter": 2, "attribute": 0, "packed": 0, "buffer_kept": 1}  # the worker extension's shape
        return {"fill": "zero", "filled_elements": 24, "draft_present": True, "target": counts, "draft": counts}
    if method == "specwake_info":
        spec = importlib.util.find_spec("vllm")
        vllm_file = spec.origin if spec and spec.origin else "/fake/site-packages/vllm/__init__.py"
        return {
            "device": "cpu",
            "platform": "cpu",
            "vllm_version": "0.32.0",
            "vllm_file": vllm_file,
            "model_classes": {"target": "FakeForCausalLM", "draft": "FakeDraftModel"},
            "tp_rank": 0,
        }
    if method == "specwake_memory":
        return {"device": "cpu", "free_bytes": None, "total_bytes": None}
    if method == "specwake_fingerprint":
        draft_lost = state.vllm.discarded and state.args.al_after <= 1.0
        return {"target": fingerprint(2, state.vllm.target_zeroed), "draft": fingerprint(1, draft_lost)}
    raise AttributeError(f"'FakeWorker' object has no attribute '{method}'")


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-vllm/0.32"
    state: State  # set on the class before serving

    def log_message(self, format: str, *args: object) -> None:
        print(f"INFO: {self.address_string()} {format % args}", flush=True)

    def reply(self, code: int, body: object = None, text: str | None = None) -> None:
        payload = text.encode() if text is not None else b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        ctype = "text/plain; version=0.0.4" if text is not None else "application/json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        data = json.loads(self.rfile.read(length) or b"{}") if length else {}
        return data if isinstance(data, dict) else {}

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        state = self.state
        if path == "/health":
            self.reply(503 if state.args.mode == "never-ready" or state.engine_dead else 200)
        elif path == "/v1/models":
            self.reply(
                200,
                {
                    "object": "list",
                    "data": [{"id": state.args.model, "object": "model", "owned_by": "vllm"}],
                },
            )
        elif path == "/metrics":
            with state.lock:
                self.reply(200, text=state.vllm.metrics_text(spec_metrics=not state.args.no_spec_metrics))
        elif path == "/is_sleeping":
            with state.lock:
                self.reply(200, {"is_sleeping": bool(state.asleep)})
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        began = time.time()
        try:
            self.post()
        finally:  # when each request ran: tests check which of a packed machine's servers were busy at once
            print(f"INFO: POST {urlsplit(self.path).path} from t={began:.6f} to t={time.time():.6f}", flush=True)

    def post(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        state = self.state
        if url.path == "/collective_rpc":
            body = self.body()
            fire_faults(state.args.fault, f"rpc:{body.get('method')}")
            self.rpc(body)
            return
        fire_faults(state.args.fault, f"path:{url.path}")
        if url.path == "/v1/completions":
            self.complete(self.body())
        elif url.path == "/sleep":
            level = int(query.get("level", ["1"])[0])
            with state.lock:
                state.asleep = set(TAGS)
                if level == 2:
                    state.vllm.discard()
                    if state.args.draft_discard_warning and not state.warned:
                        state.warned = True
                        print(DRAFT_DISCARD_WARNING.format(pid=os.getpid()), flush=True)
            self.reply(200, {"status": "sleeping", "level": level})
        elif url.path == "/wake_up":
            if state.args.mode == "oom-on-wake" and "kv_cache" in query.get("tags", TAGS):
                print(
                    "(EngineCore pid=1) ERROR [core.py:1750] torch.OutOfMemoryError: CUDA out of memory. "
                    "Tried to allocate 9.87 GiB.",
                    file=sys.stderr,
                    flush=True,
                )
                self.reply(500, {"error": {"message": "CUDA out of memory. Tried to allocate 9.87 GiB."}})
                return
            with state.lock:
                state.asleep -= set(query.get("tags", TAGS))
            self.reply(200)
        elif url.path == "/reset_prefix_cache":
            with state.lock:
                success = state.vllm.reset_prefix_cache()
            self.reply(200, {"success": success})  # vLLM 0.32 / 0.33: HTTP 200 either way, the body tells
        else:
            self.reply(404, {"detail": "Not Found"})

    def rpc(self, body: dict) -> None:
        state = self.state
        with state.lock:
            try:
                result = rpc_result(state, str(body.get("method")), dict(body.get("kwargs") or {}))
            except AttributeError as exc:
                self.reply(500, {"error": {"message": f"AttributeError: {exc}"}})
                return
        self.reply(200, {"results": [result]})

    def complete(self, req: dict) -> None:
        state = self.state
        if req.get("model", state.args.model) != state.args.model:
            msg = f"The model `{req.get('model')}` does not exist."
            self.reply(404, {"error": {"message": msg, "type": "NotFoundError", "code": 404}})
            return
        with state.lock:
            state.completions += 1
            number = state.completions
            if number == state.args.reset_counters_at:
                state.vllm.reset_counters()
        fire_faults(state.args.fault, f"completion:{number}")
        with state.lock:
            if state.asleep:
                self.reply(503, {"error": {"message": "engine is sleeping"}})
                return
            hang = state.args.mode == "hang-on-request" and state.vllm.discarded
            if state.args.mode == "engine-dead-after-discard" and state.vllm.discarded and not state.engine_dead:
                state.engine_dead = True
                print(
                    "(EngineCore pid=1) ERROR [multiproc_executor.py:316] Worker proc VllmWorker-0 died "
                    "unexpectedly (exit code: -9), shutting down executor.\n"
                    f"(APIServer pid={os.getpid()}) ERROR [serving.py:1173] "
                    f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_MESSAGE}",
                    file=sys.stderr,
                    flush=True,
                )
            dead = state.engine_dead
        if dead:
            self.reply(500, {"error": {"message": ENGINE_DEAD_MESSAGE, "type": "EngineDeadError", "code": 500}})
            return
        while hang:
            time.sleep(3600)
        tokens = int(req.get("max_tokens") or 16)
        prompt = str(req.get("prompt", ""))
        if state.args.max_model_len and len(prompt) > state.args.max_model_len:  # vLLM's text, renderers/params.py
            msg = (
                f"This model's maximum context length is {state.args.max_model_len} tokens. However, your prompt"
                f" contains {len(prompt)} input tokens, which exceeds this limit even without any output tokens."
                " Please reduce the length of the input prompt."
            )
            error = {"message": msg, "type": "BadRequestError", "param": "input_tokens", "code": 400}
            self.reply(400, {"error": error})
            return
        with state.lock:
            steps, cached = state.vllm.complete(prompt, tokens)
            al = state.vllm.acceptance_length()
        print(f"INFO: SpecDecoding metrics: Mean acceptance length: {al:.2f}", flush=True)
        request_id = f"cmpl-fake-{state.vllm.requests}"
        if req.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for step in steps:
                time.sleep(state.args.step_delay)  # one decode step: its tokens arrive together
                self.wfile.write(chunk_event(state.args.model, request_id, step))
                self.wfile.flush()
            self.wfile.write(chunk_event(state.args.model, request_id, None, usage(prompt, tokens, cached)) + DONE)
            return
        time.sleep(len(steps) * state.args.step_delay)
        text = "".join(token for step in steps for token, _ in step)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        body = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": state.args.model}
        self.reply(200, body | {"choices": [choice], "usage": usage(prompt, tokens, cached)})


def spawn_child(ignore_sigterm: bool) -> subprocess.Popen[bytes]:
    """A sleeping child in our process group, like vLLM's EngineCore; returns once it is set up."""
    code = "import signal, sys, time\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('up', flush=True)\ntime.sleep(3600)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.readline()  # its signal disposition is in place before we report ready
    return child


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--mode", choices=MODES, default="ready")
    p.add_argument("--model", default="fake-model")
    p.add_argument("--k", type=int, default=3, help="draft tokens per step")
    p.add_argument("--al-fresh", type=float, default=4.0)
    p.add_argument("--al-after", type=float, default=1.0)
    p.add_argument("--engines", type=int, default=1)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds per draft step")
    p.add_argument("--startup-delay", type=float, default=None)
    p.add_argument("--spawn-child", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--child-ignore-sigterm", action="store_true")
    p.add_argument("--fault", type=parse_fault, action="append", default=[], help="WHEN:ACTION")
    p.add_argument("--no-spec-metrics", action="store_true")
    p.add_argument("--reset-counters-at", type=int, default=0, help="N-th completion")
    p.add_argument("--no-prefix-cache", action="store_true", help="never report cached prompt tokens")
    p.add_argument("--max-model-len", type=int, default=0, help="refuse longer prompts (one token a character)")
    p.add_argument("--stale-prefix-cache", action="store_true", help="/reset_prefix_cache keeps the hashes")
    p.add_argument("--phantom-accepted", action="store_true", help="after the discard, count accepted tokens as fresh")
    p.add_argument("--draft-discard-warning", action="store_true", help="vLLM 0.34's warning at the L2 sleep")
    p.add_argument("--load-seconds", type=float, default=None, help="log vLLM's first load line with these seconds")
    p.add_argument("--reload-delay", type=float, default=0.0, help="seconds each reload_weights takes longer")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"INFO: fake vLLM API server, mode {args.mode}, pid {os.getpid()}", flush=True)
    if args.spawn_child:
        child = spawn_child(args.ignore_sigterm or args.child_ignore_sigterm)
        print(f"INFO: spawned engine core pid {child.pid}", flush=True)
    fire_faults(args.fault, "startup")
    delay = args.startup_delay
    time.sleep(delay if delay is not None else 2.0 if args.mode == "slow-start" else 0.0)
    if args.mode == "exit-early":
        print(
            "Traceback (most recent call last):\n"
            '  File "vllm/v1/engine/core.py", line 700, in run_engine_core\n'
            "RuntimeError: Engine core initialization failed. See root cause above.",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    if args.load_seconds is not None:  # as vLLM 0.32's V2 model runner logs it (vllm/v1/worker/gpu/model_runner.py)
        print(f"(EngineCore pid={os.getpid()}) INFO 12-06 04:37:22 [model_runner.py:424] Model loading took 0.01 GiB"
              f" memory and {args.load_seconds:.6f} seconds", flush=True)  # fmt: skip
    Handler.state = State(args)
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    print(f"INFO: Starting vLLM API server on http://{args.host}:{args.port} t={time.time():.6f}", flush=True)
    if args.load_seconds is not None:
        print("INFO:     Application startup complete.", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
