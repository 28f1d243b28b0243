"""The worker extension vLLM mixes into each of its workers (`--worker-extension-cls`): info, fingerprints of every
tensor of target and drafter compared with the fresh ones (values and addresses), device memory, the emulated
Level-2 discard and the weight push. specwake calls its methods by name through POST /collective_rpc; every answer
is plain JSON (no NaN, no torch types).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from specwake.protocol import FRESH, Memory, release_rules
from specwake.weight_updates import Chosen, PushAnswer, PushRequest
from specwake.worker import coverage, push, transfer
from specwake.worker.discard import emulate_discard, packed_state
from specwake.worker.finders import ROLES, named_models
from specwake.worker.tensors import Reference, data_ptrs, fingerprint, inexact
from specwake.worker.triton_cpu import dtypes_cached, language_kept

if "vllm" in sys.modules:
    # Imported by vLLM's worker (worker_base.init_worker) before it builds the worker and loads the model, which is
    # when vLLM creates the weight-transfer engine: register specwake's transport now.
    transfer.register()


SPAWNED_ARG = "--multiprocessing-fork"  # multiprocessing.spawn.get_command_line's, whatever its name says


def vllm_config_of(runner: Any) -> contextlib.AbstractContextManager[Any]:
    """The runner's vLLM config made current, as vLLM's own worker does around every load and reload
    (gpu_worker.py: `with set_current_vllm_config(self.vllm_config)`): /collective_rpc calls a method without it, and
    `get_current_vllm_config()` raises then, which quantization methods call from process_weights_after_loading."""
    config = getattr(runner, "vllm_config", None)
    if config is None:
        return contextlib.nullcontext()
    from vllm.config import set_current_vllm_config

    return set_current_vllm_config(config)


# Model Runner V2's package (vllm/v1/worker/gpu/): its GPUModelRunner is the base of every V2 runner, the CPU one
# (vllm/v1/worker/cpu/model_runner.py) included; V1's runners live in vllm/v1/worker/gpu_model_runner.py and
# cpu_model_runner.py, outside it.
V2_PACKAGE = "vllm.v1.worker.gpu."


def model_runner_of(runner: Any) -> str:
    """The runner's kind: "v2" for a runner built on Model Runner V2's classes, else "v1"."""
    return "v2" if any(c.__module__.startswith(V2_PACKAGE) for c in type(runner).__mro__) else "v1"


def start_method() -> str | None:
    """How this worker's process was started: "spawn" (a fresh interpreter: multiprocessing's spawn runs it with
    `--multiprocessing-fork` on its command line), "fork" (a copy of its parent, vLLM imported already), None for a
    process not started by multiprocessing."""
    if SPAWNED_ARG in sys.orig_argv:
        return "spawn"
    return "fork" if multiprocessing.parent_process() is not None else None


class SpecwakeWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (has ``model_runner``)."""

    model_runner: Any
    rank: int

    def _specwake_runner(self) -> Any:
        return getattr(self, "model_runner", None)

    def _specwake_references(self) -> dict[str, dict[str, Reference]]:
        """Saved fingerprints: reference name → model ("target" / "draft") → tensor name → (sums, address)."""
        refs = getattr(self, "_specwake_refs", None)
        if refs is None:
            refs = {}
            self._specwake_refs = refs
        return refs

    def _specwake_parallel(self) -> Any:
        """vLLM's parallel config of this worker; None where the worker has no config."""
        return getattr(getattr(self, "vllm_config", None), "parallel_config", None)

    def _specwake_tp(self) -> tuple[int | None, int | None]:
        """(tensor-parallel rank, TP world size) of this worker: its TP group's, else its own rank and no size."""
        try:
            from vllm.distributed import parallel_state

            group = parallel_state.get_tp_group()
            return group.rank_in_group, group.world_size
        except (AssertionError, AttributeError, ImportError):
            return getattr(self, "rank", None), None

    def _specwake_ranks(self) -> tuple[int, int]:
        """(data-parallel engine index, tensor-parallel rank) of this worker."""
        parallel = self._specwake_parallel()
        engine = int(getattr(parallel, "data_parallel_index", getattr(parallel, "data_parallel_rank", 0)) or 0)
        return engine, int(self._specwake_tp()[0] or 0)

    def _specwake_answer(self, answer: dict[str, Any], answer_dir: str | None) -> dict[str, Any]:
        """`answer`, also left as `<engine>-<rank>.json` in `answer_dir` when given: with data parallelism vLLM's
        /collective_rpc reaches every engine but returns engine 0's answers only (its load-balancing client)."""
        if answer_dir:
            engine, rank = self._specwake_ranks()
            path = Path(answer_dir) / f"{engine}-{rank}.json"
            partial = path.with_suffix(".part")
            partial.write_text(json.dumps({"engine": engine, "rank": rank, "answer": answer}))
            os.replace(partial, path)
        return answer

    def specwake_info(self, answer_dir: str | None = None) -> dict[str, Any]:
        import vllm

        models = named_models(self._specwake_runner())
        target, draft = models["target"], models["draft"]
        device = next(target.parameters()).device.type if target is not None else None
        tp_rank, world_size = self._specwake_tp()
        # "uni": this worker runs inside the engine core process; "mp": a process of its own (a class: its name)
        backend = getattr(self._specwake_parallel(), "distributed_executor_backend", None)
        info = {
            "device": device,
            "engine": self._specwake_ranks()[0],
            "vllm_version": str(getattr(vllm, "__version__", None)),
            "vllm_file": getattr(vllm, "__file__", None),
            "torch_version": str(torch.__version__),  # TorchVersion breaks msgspec
            "target_class": type(target).__name__ if target is not None else None,
            "draft_class": type(draft).__name__ if draft is not None else None,
            "runner_class": type(self._specwake_runner()).__name__,
            "model_runner": model_runner_of(self._specwake_runner()),
            "triton_interpreted": os.environ.get("TRITON_INTERPRET") == "1",
            "triton_language_kept": language_kept(),  # the interpreter's builtins swapped once (worker/triton_cpu.py)
            "triton_dtypes_cached": dtypes_cached(),  # its numpy dtype lookups answered from a table (the same)
            "tp_rank": tp_rank,
            "world_size": world_size,
            "executor": getattr(backend, "__name__", backend),
            "started": start_method(),
        }
        return self._specwake_answer(info, answer_dir)

    def specwake_fingerprint(
        self,
        save_as: str | None = None,
        compare_to: str | None = None,
        answer_dir: str | None = None,
        inexact_tensors: dict[str, str] | None = None,
        changed_since: str | None = None,
    ) -> dict[str, Any]:
        """Summaries of every tensor of target and drafter, by kind. `save_as`: remember this call's digests, sums and
        addresses under that name, and, when fresh, which tensors are inexact (specwake.worker.tensors.INEXACT and the
        scenario's `inexact_tensors`: glob → why); `compare_to`: count the tensors that differ from the ones saved
        under that name (each with how) and those that moved to another address since; `changed_since`: also count
        those that differ from the ones saved under this other name (nothing when none were saved under it)."""
        runner = self._specwake_runner()
        models = named_models(runner)
        refs = self._specwake_references()
        saved = refs.get(compare_to or "", {}) if compare_to else None
        earlier = refs.get(changed_since) if changed_since else None
        if save_as == FRESH:  # which parameters no load writes, and which tensors are inexact, found once
            self._specwake_coverage = {role: self._specwake_uncovered(runner, role, models) for role in ROLES}
            self._specwake_inexact = {role: inexact(models[role], inexact_tensors or {}) for role in ROLES}
        found = getattr(self, "_specwake_coverage", {})
        projected = getattr(self, "_specwake_inexact", {})
        answer: dict[str, Any] = {}
        kept: dict[str, Reference] = {}
        for role in ROLES:
            kept[role] = {}
            uncovered, error = found.get(role, (frozenset(), None))
            answer[role] = fingerprint(
                models[role],
                exclude=data_ptrs(models["target"]) if role == "draft" else None,
                reference=None if saved is None else saved.get(role, {}),
                keep=kept[role],
                since=None if earlier is None else earlier.get(role, {}),
                packed=packed_state(models[role]),
                uncovered=uncovered,
                coverage_error=error,
                inexact=projected.get(role, frozenset()),
            )
        if save_as:
            refs[save_as] = kept
        return self._specwake_answer(answer, answer_dir)

    @staticmethod
    def _specwake_uncovered(
        runner: Any, role: str, models: dict[str, torch.nn.Module | None]
    ) -> tuple[frozenset[str], str | None]:
        """(the parameters of `role`'s model that no load writes, why that is unknown): a dry run of the model's
        load_weights over its checkpoint (specwake.worker.coverage). A drafter's parameters that are the target's
        are the target's to judge. Never raises: a dry run that fails leaves every parameter judged."""
        model, config = models[role], getattr(runner, "vllm_config", None)
        if model is None or config is None:
            return frozenset(), None
        spec = config.speculative_config
        model_config = config.model_config if role == "target" else getattr(spec, "draft_model_config", None)
        if model_config is None:
            return frozenset(), None
        try:
            with vllm_config_of(runner):
                weights = coverage.checkpoint_names(config, model_config, model)
                names = coverage.uncovered(model, weights, coverage.constructed(model))
        except Exception as exc:  # noqa: BLE001 (any failure of a model's own load_weights: judged as before)
            return frozenset(), f"{type(exc).__name__}: {exc}"[:300]
        shared = data_ptrs(models["target"]) if role == "draft" else set()
        params = dict(model.named_parameters())
        return frozenset(n for n in names if params[n].data_ptr() not in shared), None

    def specwake_memory(self, answer_dir: str | None = None) -> dict[str, Any]:
        """Free/total accelerator memory of this rank in bytes; None on CPU (no device memory to report)."""
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        if device is None:
            return self._specwake_answer(asdict(Memory("cpu")), answer_dir)
        free, total = torch.cuda.mem_get_info(device)
        return self._specwake_answer(asdict(Memory(f"cuda:{device}", int(free), int(total))), answer_dir)

    def specwake_push(self, request: str = "{}") -> dict[str, Any]:
        """Wake with new weights the way RL frameworks do (verl's update_weights_from_ipc): tensors pushed into the live
        models through load_weights, not reload_weights from disk. `request` is JSON, as /collective_rpc passes strings
        (weight_updates.PushRequest): {"to": ["target"] | ["target", "draft"], "chosen": {model: {"skip": [names],
        "scale": {name: factor}}}}, the names each model's push leaves out and scales, as the CLI resolved them against
        the manifest, and "fault", a misrouted update planted on purpose (weight_updates.PUSH_FAULTS). The drafter goes
        first, the target last, so modules they share end up with the target's tensors (specwake calls it once per
        model, in that order). The answer's `unmatched` lists chosen names the model's push never met (the push went
        through without them): for the caller to report."""
        spec = PushRequest.from_json(request)
        runner = self._specwake_runner()
        seen = {role: push.Seen() for role in spec.to}
        done = {}
        with vllm_config_of(runner):
            if "draft" in spec.to:
                done["draft"] = push.push_draft(self, spec.chosen.get("draft", Chosen()), seen["draft"], spec.fault)
            if "target" in spec.to:
                done["target"] = push.push_target(self, spec.chosen.get("target", Chosen()), seen["target"], spec.fault)
        unmatched = {
            name
            for role, chosen in spec.chosen.items()
            for name in (*chosen.skip, *chosen.scale)
            if role in seen and name not in seen[role].names
        }
        scaled = sorted({n for s in seen.values() for n in s.scaled})
        skipped = sorted({n for s in seen.values() for n in s.skipped})
        return asdict(PushAnswer(done, scaled, sorted(unmatched), skipped))

    def specwake_transfer_manifest(self, role: str = "target") -> list[dict[str, Any]]:
        """The chunks a weight sync sends for one model's session (specwake.worker.transfer.manifest); none for a
        drafter session when the server has no drafter model. Runs on every rank: each resolves its engine's files
        here, before any cycle, so no /update_weights resolves them (a Hub id would ask the Hub)."""
        runner = self._specwake_runner()
        vllm_config = runner.vllm_config
        model_config = vllm_config.model_config
        if role == "draft":
            spec = vllm_config.speculative_config
            model_config = spec.draft_model_config if spec is not None else None
        model = named_models(runner)[role]
        if model is None or model_config is None:
            return []
        engine = getattr(self, "weight_transfer_engine", None)
        sources = getattr(engine, "sources", None)
        if not isinstance(sources, transfer.SessionSources):  # no specwake engine (the sync would be refused)
            sources = transfer.SessionSources(vllm_config)
        chunks = transfer.manifest(sources.of(model, model_config), role)
        return [chunk.to_dict() for chunk in chunks]

    def specwake_emulate_discard(self, fill: str = "zero", rules: str | None = None) -> dict[str, Any]:
        """Discard from target and drafter what a real L2 sleep of vLLM release `rules` discards ("0.33" or "0.34";
        None: the rules of the vLLM this worker runs), honouring the server's --sleep-preserve-parameter-names as that
        release does (specwake.worker.discard)."""
        if rules is None:
            import vllm

            rules = release_rules(str(getattr(vllm, "__version__", "")))
        runner = self._specwake_runner()
        config = getattr(self, "vllm_config", None) or getattr(runner, "vllm_config", None)
        preserve = getattr(getattr(config, "model_config", None), "sleep_preserve_parameter_names", None) or ()
        return emulate_discard(named_models(runner), fill, rules, tuple(preserve))
