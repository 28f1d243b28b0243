"""What the workers answered, typed from diagnose to the report: a Diagnostic and a Push read back what they wrote,
and a result file written before they had types reads as it did."""

from __future__ import annotations

from dataclasses import replace

from specwake.protocol import Fingerprint, Memory
from specwake.results import CheckerReading, Diagnostic, Push, from_dict, to_dict
from tests.helpers.builders import tiny_cpu

# As specwake wrote them before the types: one rank with a target and no drafter, memory, a failed probe.
OLD_ENTRIES = [
    {
        "cycle": 0, "point": "after fresh",
        "fingerprints": [{"target": {"class": "Llama", "tensors": 9, "numel": 90}, "draft": {"present": False}}],
        "weight_checker": {"offered": True, "parameters": 9},
    },
    {"cycle": 1, "point": "before sleep", "memory": [{"device": "cuda:0", "free_bytes": 7, "total_bytes": 9}]},
    {
        "cycle": 1, "point": "after weight sync",
        "fingerprints": [{"target": {"class": "Llama", "tensors": 9, "compared": 9, "differ": 1, "differ_names": ["a"],
                                     "differ_by_kind": {"parameter": 1}, "moved": 0, "moved_names": [],
                                     "moved_by_kind": {}, "uncovered_differ": 0, "uncovered_differ_names": []}}],
        "weight_checker": {"match": False, "mismatches": 1, "names": ["a"], "parameters": 9},
    },
    {"cycle": 2, "point": "after discard", "error": "HTTP 500 from /collective_rpc"},
]  # fmt: skip


def test_an_old_entry_reads_into_types_and_writes_back_unchanged() -> None:
    taken = [Diagnostic.from_dict(entry) for entry in OLD_ENTRIES]
    fresh, asleep, synced, failed = taken
    assert fresh.parts("target")[0] == Fingerprint(model_class="Llama", tensors=9, numel=90)
    assert fresh.parts("draft") == (None,)  # a rank without a drafter
    assert fresh.weight_checker == CheckerReading(offered=True, parameters=9)
    assert asleep.memory == (Memory("cuda:0", 7, 9),) and asleep.fingerprints == ()
    assert synced.weight_checker is not None and synced.weight_checker.names == ("a",)
    assert failed.error == "HTTP 500 from /collective_rpc" and failed.parts("target") == ()
    written = [d.to_dict() for d in taken]
    assert [Diagnostic.from_dict(d) for d in written] == taken
    assert [sorted(d) for d in written] == [sorted(d) for d in OLD_ENTRIES]  # only what was taken
    assert written[1:2] + written[3:] == OLD_ENTRIES[1:2] + OLD_ENTRIES[3:]
    assert written[0]["fingerprints"][0]["target"]["class"] == "Llama"  # a fingerprint writes as the worker does
    assert written[0]["fingerprints"][0]["draft"] == {"present": False}
    assert written[2]["weight_checker"] == OLD_ENTRIES[2]["weight_checker"]


def test_a_result_keeps_its_diagnostics_and_push_typed_through_its_file() -> None:
    result = tiny_cpu()
    push = Push(
        ("target", "draft"), {"draft:x": 1.05}, "weight_transfer", ("draft:y",), {"target": 0, "draft": 1}, None
    )
    patched = replace(result.variants[1], diagnostics=[Diagnostic.from_dict(e) for e in OLD_ENTRIES], push=push)
    result = replace(result, variants=[result.variants[0], patched])
    written = to_dict(result)
    assert written["variants"][1]["diagnostics"] == [d.to_dict() for d in patched.diagnostics]
    assert written["variants"][1]["push"] == {
        "to": ["target", "draft"], "scale": {"draft:x": 1.05}, "via": "weight_transfer", "skip": ["draft:y"],
        "scaled": {"target": 0, "draft": 1},
    }  # fmt: skip
    assert written["variants"][0]["push"] is None
    assert from_dict(written) == result


def test_a_checker_that_failed_or_is_not_offered_says_only_that() -> None:
    for reading in (CheckerReading(error="timeout"), CheckerReading(offered=False, status=404)):
        assert CheckerReading.from_dict(reading.to_dict()) == reading
        assert "names" not in reading.to_dict()
    assert CheckerReading.from_dict(None) is None
