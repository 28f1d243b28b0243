"""The report's lines beyond AL: the prefix cache after each wake, tokens and logprobs against fresh, the wake's
cost, and over many cycles the ledger and its drift — computed here from stages and steps built for the purpose."""

from __future__ import annotations

from dataclasses import replace

from specwake.report.cycles import cost_table, drift_line, ledger, logprob_line, prefix_cache_line
from specwake.results import MIB, StageResult, StepResult
from tests.helpers import builders

BASE = builders.variant("patched", "recover", "recover")


def stage(cycle: int, **kw: object) -> StageResult:
    """AL 4.00 (10 drafts, all 30 tokens accepted), 100 tok/s, TPOT 4 ms, a clean prefix cache after the wake."""
    cycles = {"tpot": [0.004], "first_request_ttft": 0.05, "prefix_cached": 0, "prefix_cached_repeat": 256}
    return builders.stage(cycle, drafts=10, accepted=30, tok_s=[100.0], tokens=40, **(cycles | kw))


def steps(cycles: int, rss_step_mib: float = 0.0) -> list[StepResult]:
    out = []
    for c in range(1, cycles + 1):
        out.append(StepResult(c, "wake_weights", "POST", "/wake_up", 200, 0.1, True))
        rss = int((1000 + rss_step_mib * c) * MIB)
        out.append(StepResult(c, "reload_weights", "POST", "/collective_rpc", 200, 0.2 + 0.01 * c, True, rss_bytes=rss))
    return out


def test_prefix_cache_line_says_clean_or_stale() -> None:
    clean = replace(BASE, stages=[stage(0), stage(1), stage(2)])
    line = prefix_cache_line([clean])[0]
    assert "patched 0 · 0 cached tokens" in line and "the same prompt again: 256 cached" in line
    assert line.endswith("no stale hashes")
    stale = replace(BASE, stages=[stage(0), stage(1, prefix_cached=128)])
    assert prefix_cache_line([stale])[0].endswith("STALE: tokens served from a cache the wake emptied")
    off = replace(BASE, stages=[stage(0, prefix_cached_repeat=0), stage(1, prefix_cached_repeat=0)])
    assert "prefix caching off" in prefix_cache_line([off])[0]


def test_logprob_line_names_identical_text_with_drifting_probabilities() -> None:
    drifting = replace(BASE, stages=[stage(0), stage(1, max_logprob_drift=0.02, logprobs_over_tolerance=5,
                                                       logprobs_compared=120)])  # fmt: skip
    line = logprob_line(drifting) or ""
    assert "identical tokens; logprob drift up to 0.02 (5/120 positions over 0.001)" in line
    assert "same text, different probabilities" in line
    diverged = replace(BASE, stages=[stage(0), stage(1, first_difference=[2, 7], logprobs_compared=14,
                                                       max_logprob_drift=0.0)])  # fmt: skip
    assert "tokens differ from fresh at after L2 #1, request 3, token 7" in (logprob_line(diverged) or "")
    assert logprob_line(replace(BASE, stages=[stage(0)])) is None


def test_ledger_and_drift_over_many_cycles() -> None:
    soak = replace(BASE, stages=[stage(0), *[stage(c) for c in range(1, 6)]], steps=steps(5, rss_step_mib=2.0))
    rows = ledger(soak)
    assert (
        rows[2].startswith("| cycle | AL | TPOT ms")
        and len([r for r in rows if r.startswith("| ") and r[2].isdigit()]) == 5
    )
    assert "| 3 | 4.00 | 4.00 | 50.0 | 0.330 | 1006 | n/a (cpu) |" in rows
    line = drift_line(soak) or ""
    assert "drift per cycle over 5 cycles" in line and "host RSS +2.00 [+2.00, +2.00] MiB" in line
    assert "wake +0.0100 [+0.0100, +0.0100] s" in line
    assert drift_line(replace(soak, steps=steps(2), stages=[stage(0), stage(1), stage(2)])) is None  # too few


def test_the_al_drift_claims_no_change_al_cannot_make() -> None:
    """AL lies in [1, K + 1]: over cycles 1–3 it can change by at most K = 3, 1.5 a cycle. AL 4, 1, 4 fits a flat line
    whose t interval (1 degree of freedom) is ±22 a cycle: printed as ±1.5."""
    swinging = [builders.stage(c, drafts=10, accepted=30 if c % 2 else 0) for c in (1, 2, 3)]
    line = drift_line(replace(BASE, stages=[stage(0), *swinging], steps=steps(3))) or ""
    assert line.endswith("AL +0.0000 [-1.5000, +1.5000]"), line
    falling = [builders.stage(c, drafts=10, accepted=max(0, 30 - 15 * c)) for c in (1, 2, 3)]  # AL 2.5, 1, 1
    assert drift_line(replace(BASE, stages=[stage(0), *falling], steps=steps(3))).endswith(  # type: ignore[union-attr]
        "AL -0.7500 [-1.5000, +1.5000]"
    )


def test_cost_table_sets_variants_side_by_side() -> None:
    table = cost_table([replace(BASE, steps=steps(3)), replace(BASE, name="preserve", steps=steps(3, 50.0))])
    assert table[1] == (
        "| variant | wake + reload per cycle (s, median) | host RSS asleep (MiB, median) |"
        " host RSS after wake (MiB, median) |"
    )
    assert table[3] == "| patched | 0.320 | – | 1000 |" and table[4] == "| preserve | 0.320 | – | 1100 |"


def test_cost_table_shows_what_a_sleep_holds_in_host_memory() -> None:
    """--sleep-preserve-parameter-names copies the drafter's parameters to host memory before an L2 sleep (vLLM's
    gpu_worker.py _save_sleep_parameters) and holds them until the wake: its cost is there."""
    asleep = [StepResult(c, "sleep", "POST", "/sleep", 200, 1.0, True, rss_bytes=int(3000 * MIB)) for c in (1, 2, 3)]
    table = cost_table([replace(BASE, name="preserve", steps=asleep + steps(3))])
    assert table[3] == "| preserve | 0.320 | 3000 | 1000 |"


def test_the_step_table_shows_vllms_own_seconds_only_where_it_kept_them() -> None:
    from specwake.report.details import details

    plain = "\n".join(details(replace(BASE, steps=steps(1))))
    assert "| cycle | step | HTTP | seconds |\n" in plain
    timed = [replace(s, vllm_seconds=0.05) if s.name == "wake_weights" else s for s in steps(1)]
    text = "\n".join(details(replace(BASE, steps=timed)))
    assert "| cycle | step | HTTP | seconds | vLLM's seconds |" in text
    assert "| 1 | wake_weights | 200 | 0.100 | 0.050 |" in text and "| 1 | reload_weights | 200 | 0.210 | – |" in text
