"""One sleep/wake cycle against a running server, every step timed with its HTTP status.

Level 2: sleep → [emulated discard, by the rules of a named vLLM release] → wake weights → reload_weights → wake
kv_cache → reset prefix cache.
With a push (RL trainers' weight update) the reload is specwake_push, one call per model (drafter, then target), at
either level; with a sync through vLLM's weight-transfer API it is [init_weight_transfer_engine, first cycle only] →
per model (target, then drafter): start → update_weights per chunk → finish. Both models are fingerprinted before the
first model's update and after each (protocol.BEFORE_UPDATE, UPDATE_POINT), each update's step naming the model it
addresses. A variant's push_fault plants a misrouted update here (a sync) or in the worker (a push). Level 1 without
either wakes everything at once (its weights were offloaded, not discarded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from specwake import protocol, weight_updates
from specwake.errors import InputRejected, RequestFailed, RequestTimeout, ServerFault
from specwake.protocol import StepKind
from specwake.results import StepResult
from specwake.run.measure.client import Answer, VllmClient
from specwake.weight_updates import PushAnswer, PushRequest, TransferChunk


@dataclass(frozen=True)
class Step:
    """One step of a cycle: its kind (protocol.STEPS) and this cycle's arguments."""

    kind: StepKind
    params: tuple[tuple[str, str], ...] = ()
    rpc_kwargs: tuple[tuple[str, str], ...] = ()
    body: Any = None  # a JSON body (the weight-transfer calls)
    ends_sync: bool = False  # the last step of a weight sync: its weights are judged after it
    # The step that ends one model's push or sync session: the model the update addresses (as the trainer meant it,
    # wherever a planted fault sends it), and whether it is the cycle's last update (its restore point follows)
    addresses: str | None = None
    last_update: bool = False
    before_update: bool = False  # the wake right before a push or sync: both models are fingerprinted after it

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def point(self) -> str:
        """The probe point after this step."""
        if self.before_update:
            return protocol.BEFORE_UPDATE
        if self.addresses is not None and not self.last_update:
            return protocol.UPDATE_POINT
        return protocol.SYNC_POINT if self.ends_sync else self.kind.point

    @property
    def method(self) -> str:
        return self.kind.method

    @property
    def path(self) -> str:
        return self.kind.path

    @property
    def rpc(self) -> str | None:
        return self.kind.rpc


def cycle_steps(
    level: int,
    emulate_discard: bool,
    fill: str = "zero",
    push: PushRequest | None = None,
    *,
    cycle: int = 1,
    chunks: dict[str, list[TransferChunk]] | None = None,
    rules: str | None = None,
) -> list[Step]:
    """The step sequence of one cycle at the given sleep level. `fill`: what the emulated discard leaves in the
    parameters (zero | nan | random); `rules`: whose L2 sleep it follows (protocol.DISCARD_RULES; None: the worker's
    vLLM's); `push`: a weight push or sync, which replaces reload_weights; `chunks`: a sync's update_weights calls per
    model (None: one stands for all, as `check` describes it)."""
    sleep = Step(protocol.SLEEP, (("level", str(level)),))
    reset = Step(protocol.RESET_PREFIX_CACHE)
    if level == 1 and push is None:
        return [sleep, Step(protocol.WAKE_UP), reset]
    steps = [sleep]
    if emulate_discard and level == 2:
        chosen = (("rules", rules),) if rules is not None else ()
        steps.append(Step(protocol.DISCARD_STEP, rpc_kwargs=(("fill", fill), *chosen)))
    steps.append(Step(protocol.WAKE_WEIGHTS, (("tags", "weights"),), before_update=push is not None))
    kind = weight_updates.KIND_BY_VIA[push.via if push is not None else None]
    steps += RESTORE_STEPS[kind.name](push, cycle, chunks)
    return [*steps, Step(protocol.WAKE_KV_CACHE, (("tags", "kv_cache"),)), reset]


Chunks = dict[str, list[TransferChunk]]


def reload_steps(push: PushRequest | None, cycle: int, chunks: Chunks | None) -> list[Step]:
    """vLLM's reload_weights: every model from its checkpoint, as vLLM's docs wake an L2 sleep."""
    return [Step(protocol.RELOAD_STEP)]


def push_steps(push: PushRequest | None, cycle: int, chunks: Chunks | None) -> list[Step]:
    """specwake's push: the checkpoint's tensors loaded into the live models, as RL trainers did, one call per model
    (weight_updates.PUSH_ORDER), so that each model's update is judged on its own."""
    assert push is not None
    roles = [r for r in weight_updates.PUSH_ORDER if r in push.to]
    return [
        Step(protocol.PUSH_STEP, rpc_kwargs=(("request", replace(push, to=(role,)).to_json()),), addresses=role,
             last_update=role == roles[-1])
        for role in roles
    ]  # fmt: skip


def sync_steps(push: PushRequest | None, cycle: int, chunks: Chunks | None) -> list[Step]:
    """A weight sync as RL frameworks run it (SkyRL, vime): the transfer engine initialized once, then one session
    per model, the target's first. A planted push_fault misroutes one: the drafter's tensors sent in a target session
    (DRAFT_TO_TARGET), a draft session that sends none (EMPTY_DRAFT), or the target's sent in a draft session as well
    (TARGET_ALSO_TO_DRAFT); the session still counts as the update of the model it was meant for."""
    assert push is not None
    steps = [Step(protocol.INIT_TRANSFER, body={"init_info": {}})] if cycle == 1 else []
    sessions = []  # (the model addressed, the session's start, the chunks it sends)
    for role in (r for r in weight_updates.SYNC_ORDER if r in push.to):
        # `chunks` None: a description (`check`), one call stands for all; a session left with none sends nothing
        sent = [TransferChunk(role, "…", ())] if chunks is None else chunks.get(role, [])
        start = protocol.START_DRAFT_UPDATE if role == "draft" else protocol.START_UPDATE
        if role == "draft" and push.fault == weight_updates.DRAFT_TO_TARGET:
            start = protocol.START_UPDATE
        sent = [] if role == "draft" and push.fault == weight_updates.EMPTY_DRAFT else sent
        sessions.append((role, start, sent))
        if role == "target" and push.fault == weight_updates.TARGET_ALSO_TO_DRAFT:
            sessions.append((role, protocol.START_DRAFT_UPDATE, sent))
    for i, (role, start, sent) in enumerate(sessions):
        last = i == len(sessions) - 1
        steps += [
            Step(start),
            *(Step(protocol.UPDATE_WEIGHTS, body={"update_info": chunk.update_info()}) for chunk in sent),
            Step(protocol.FINISH_UPDATE, ends_sync=last, addresses=role, last_update=last),
        ]
    return steps


# The steps that bring the weights back after `wake_weights`, per weight_updates.RELOAD_KINDS row.
RESTORE_STEPS: dict[str, Callable[[PushRequest | None, int, Chunks | None], list[Step]]] = {
    weight_updates.RELOAD_KIND.name: reload_steps,
    weight_updates.PUSH_KIND.name: push_steps,
    weight_updates.SYNC_KIND.name: sync_steps,
}


def _call(client: VllmClient, step: Step, timeout: float) -> Answer:
    if step.rpc is not None:
        return client.collective_rpc(step.rpc, timeout=timeout, kwargs=dict(step.rpc_kwargs))
    return client.request(step.method, step.path, params=list(step.params), json=step.body, timeout=timeout)


def _label(step: Step) -> str:
    query = "&".join(f"{k}={v}" for k, v in step.params)
    return f"{step.path}?{query}" if query else step.path + (f" {step.rpc}" if step.rpc else "")


def run_cycle(
    client: VllmClient,
    cycle: int,
    *,
    level: int,
    emulate_discard: bool,
    step_timeout_s: float,
    fill: str = "zero",
    discard_rules: str | None = None,
    push: PushRequest | None = None,
    chunks: dict[str, list[TransferChunk]] | None = None,
    on_step: Callable[[StepResult, str, str | None], None] | None = None,
    host_rss: Callable[[], int | None] = lambda: None,
    vllm_seconds: Callable[[StepKind], float | None] = lambda kind: None,
) -> tuple[list[StepResult], ServerFault | None]:
    """Run every step in order; stop at the first failed one and return it as the fault. `host_rss` is read
    after every step (the wake ledger), `vllm_seconds` too: vLLM's own timing of the call, where it keeps one.
    `discard_rules`: the release whose L2 sleep an emulated discard follows (None: the worker's vLLM's). `on_step`
    gets each result, the probe point after it, and the model the update it ends addresses (None for other steps)."""
    results: list[StepResult] = []
    for step in cycle_steps(level, emulate_discard, fill, push, cycle=cycle, chunks=chunks, rules=discard_rules):
        fault: ServerFault | None = None
        body: Any = None
        try:
            answer = _call(client, step, step_timeout_s)
        except (RequestTimeout, RequestFailed) as exc:
            fault = exc
            result = StepResult(
                cycle,
                step.name,
                step.method,
                _label(step),
                None,
                step_timeout_s if isinstance(exc, RequestTimeout) else 0.0,
                False,
                str(exc),
                rss_bytes=host_rss(),
            )
        else:
            body = answer.body
            error = None
            if not answer.ok:
                error = f"{step.name}: HTTP {answer.status}: {_text(body)}"
            elif isinstance(body, dict) and body.get("success") is False:
                # /reset_prefix_cache answers 200 {"success": false} when it could not reset (blocks in use).
                error = f'{step.name}: HTTP {answer.status} but the server says {{"success": false}}'
            problem = _scenario_problem(step, body) if error is None else None
            if problem is not None:
                error = problem
                fault = InputRejected(problem)
            elif error is not None:
                fault = RequestFailed(error)
            ok = error is None
            result = StepResult(
                cycle,
                step.name,
                step.method,
                _label(step),
                answer.status,
                answer.seconds,
                ok,
                error,
                _keep(body),
                host_rss(),
                vllm_seconds(step.kind) if ok else None,
            )
        results.append(result)
        if on_step is not None:
            on_step(result, step.point, step.addresses)
        if fault is not None:
            return results, fault
    return results, None


def _scenario_problem(step: Step, body: Any) -> str | None:
    """A step the server carried out, but that shows the scenario itself wrong: a push that never met a tensor its
    push_scale or push_skip picked (the perturbation never happened, so a perturbed push could not be judged)."""
    if step.kind is not protocol.PUSH_STEP or not isinstance(body, dict):
        return None
    answers = [PushAnswer.from_dict(r) for r in body.get("results") or []]
    unmatched = sorted({name for answer in answers for name in answer.unmatched})
    if not unmatched:
        return None
    return f"{step.name}: push_scale or push_skip picked tensors the push never met: {', '.join(unmatched)}"


def _text(body: Any, limit: int = 2000) -> str:
    if isinstance(body, dict) and "error" in body:
        body = body["error"]
    if isinstance(body, dict) and "message" in body:
        body = body["message"]
    text = body if isinstance(body, str) else repr(body)
    return text[:limit]


def _keep(body: Any) -> Any:
    """Small JSON answers are kept in results (e.g. discard counts); large ones are dropped."""
    return body if len(repr(body)) <= 4000 else None
