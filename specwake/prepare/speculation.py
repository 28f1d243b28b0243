"""The guard on the speculative config: what a variant's vLLM read from its configuration (its own SpeculativeConfig
and schedule lookup, specwake.worker.validate `speculation_in_force`) judged before anything starts. A configuration
under which AL judges no drafter is exit 2 naming the key that set it; `check` says the K in force.

- `rejection_sample_method = "synthetic"` (vLLM 0.32+): drafts are accepted at rates the configuration sets, not as the
  target verifies them, so AL is configuration and a dead drafter looks healthy.
- `"fly"` (0.33+): verification is lossy (FLy), so outputs may differ from fresh by design and the outputs check
  means nothing: refused, not run with that check void.
- K at the workload's concurrency: a stage sends its requests one at a time (specwake.run.measure.measure), so every
  decode step of a measured stage has that many requests; `num_speculative_tokens_per_batch_size` gives K per batch
  size, and K = 0 there drafts nothing. With data parallelism (data_parallel_size > 1) vLLM's engine config drops the
  schedule and drafts num_speculative_tokens at every batch size (its ranks could pick different K): that K is the one
  judged and said. Adaptive verification (`enable_adaptive_verification`) verifies at most that K per request, a
  budget vLLM sizes each step: said beside the K.
"""

from __future__ import annotations

from typing import Any

from specwake.errors import ScenarioError
from specwake.prepare.scenario import Scenario, Variant
from specwake.protocol import ADAPTIVE_FIELD, K_FIELD, METHOD_FIELD, SCHEDULE_FIELD

# Requests a measured stage has at once on an engine (specwake.run.measure.measure sends them one at a time): the batch
# size whose K the schedule decides.
REQUESTS_AT_ONCE = 1


# Rejection sampling methods under which AL or the outputs judge no drafter, and why (vLLM's own values).
REFUSED_METHODS = {
    "synthetic": (
        "vLLM {version} accepts drafts at the rates the configuration sets (synthetic_acceptance_rates or"
        " synthetic_acceptance_length), not as the target verifies them: AL is set by configuration and judges no"
        " drafter"
    ),
    "fly": (
        "vLLM {version} verifies drafts lossily (FLy), so outputs may differ from fresh by design and the check that"
        " outputs equal fresh would mean nothing"
    ),
}


def _key(scenario: Scenario, variant: Variant, found: dict[str, Any], name: str) -> str:
    """The scenario key that gave field `name` its value: the [speculative] table's, server.args, or the variant's
    args. The scenario refuses `--speculative-config`, `-sc` and their dotted forms there (server_args.py); a spelling
    vLLM's parser still takes for them, such as an abbreviation, replaces the table as in the server."""
    source = (found.get("set_by") or {}).get(name, "speculative")
    if source == "variant_args":
        return f"variants.{variant.name}.args"
    return "server.args" if source == "args" else f"speculative.{name}"


def check_speculation(scenario: Scenario, variant: Variant, found: dict[str, Any] | None, version: str) -> None:
    """Raise ScenarioError (exit 2) where vLLM's reading of the variant's configuration leaves AL judging no drafter:
    a refused rejection sampling method, a schedule vLLM refuses, or K = 0 at the workload's concurrency."""
    if not found or not variant.speculative:
        return
    file, fields = str(scenario.file), found.get("fields") or {}
    method = fields.get(METHOD_FIELD)
    if method in REFUSED_METHODS:
        why = REFUSED_METHODS[str(method)].format(version=version)
        raise ScenarioError(file, _key(scenario, variant, found, METHOD_FIELD), f'"{method}": {why}')
    if found.get("k_problem"):
        key = _key(scenario, variant, found, SCHEDULE_FIELD)
        raise ScenarioError(file, key, f"vLLM {version}'s batch-size schedule refuses it: {found['k_problem']}")
    if found.get("k_in_force") == 0:
        key = _key(scenario, variant, found, SCHEDULE_FIELD)
        at = _at(int(found.get("batch_size") or REQUESTS_AT_ONCE))
        raise ScenarioError(
            file, key, f"K is 0 {at} by this schedule: vLLM drafts nothing there, so AL would judge no drafter"
        )


def _at(batch_size: int) -> str:
    return f"at {batch_size} request{'s' if batch_size != 1 else ''} at a time (the workload's concurrency)"


def speculation_line(found: dict[str, Any] | None) -> str | None:
    """`check`'s line for a variant: the K in force at the workload's concurrency, where it comes from, and how
    drafts are verified; None where vLLM could not say."""
    if not found:
        return None
    fields = found.get("fields") or {}
    k, configured = found.get("k_in_force"), fields.get(K_FIELD)
    said = f"K {k}" if k is not None else "K from the drafter's config (n_predict)"
    said += f" {_at(int(found.get('batch_size') or REQUESTS_AT_ONCE))}"
    if found.get("schedule_dropped"):
        said += f" ({K_FIELD}: vLLM drops {SCHEDULE_FIELD} under {found['schedule_dropped']})"
    elif fields.get(SCHEDULE_FIELD) is not None:
        said += f" (by {SCHEDULE_FIELD}; {K_FIELD} {configured if configured is not None else 'from the drafter'})"
    if fields.get(ADAPTIVE_FIELD):
        said += "; adaptive verification: vLLM verifies at most that many drafts per request, a budget sized per step"
    if fields.get(METHOD_FIELD) is not None:
        said += f"; rejection sampling {fields[METHOD_FIELD]}"
    return said
