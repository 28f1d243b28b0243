"""Unit tests of specwake.protocol: the step table gives every derived set, and every typed answer reads what the
worker writes and what older result files hold."""

from __future__ import annotations

import json
from dataclasses import replace

from specwake import protocol, weight_updates
from specwake.protocol import DiscardAnswer, Fingerprint, Memory
from specwake.results import Push
from specwake.weight_updates import PushAnswer, PushRequest


def test_the_step_table_gives_the_probe_points_the_restore_points_and_the_wake() -> None:
    restore = ("after reload_weights", "after push", "after weight sync")
    updates = {"before update", "after update"}  # around each model's push or sync session
    assert protocol.FINGERPRINT_POINTS == {"after fresh", "after discard", *restore, "after stage", *updates}
    awake = {"after wake_weights", *restore, "after wake_kv_cache"}
    assert protocol.MEMORY_POINTS == {"before sleep", "after sleep", *awake}
    assert protocol.RESTORE_POINTS == restore
    sync = ("start_weight_update", "start_draft_weight_update", "update_weights", "finish_weight_update")
    assert protocol.WAKE_STEPS == ("wake_weights", "reload_weights", "push", *sync, "wake_kv_cache", "wake_up")
    assert protocol.AWAKE_POINT == "after wake_kv_cache"
    assert {s.name for s in protocol.STEPS if s.rpc} == {"discard", "reload_weights", "push"}


def test_a_push_request_travels_as_json_and_back() -> None:
    request = PushRequest(("target", "draft"), {"lm_head.weight": 2.0})
    assert PushRequest.from_json(request.to_json()) == request
    assert PushRequest.from_json("{}") == PushRequest()  # the default push: the target, unscaled
    # in result files: a push reads as it always did, a sync says so
    assert Push.of(request).to_dict() == {"to": ["target", "draft"], "scale": {"lm_head.weight": 2.0}}
    sync = Push.of(PushRequest(("target",), via=weight_updates.SYNC_VIA))
    assert sync.to_dict()["via"] == "weight_transfer" and Push.from_dict(sync.to_dict()) == sync and sync.syncs
    assert PushAnswer.from_dict({"pushed": {"target": "pushed"}, "scaled": [], "extra": 1}).unmatched == []
    # a planted misroute travels to the worker and is kept in results; a push without one reads as before
    planted = PushRequest(("target", "draft"), fault=weight_updates.DRAFT_TO_TARGET)
    assert PushRequest.from_json(planted.to_json()) == planted
    assert json.loads(planted.to_json())["fault"] == "draft-to-target"
    kept = Push.of(planted)
    assert kept.to_dict()["fault"] == "draft-to-target" and Push.from_dict(kept.to_dict()) == kept


def test_a_fingerprint_reads_back_what_it_wrote_and_old_results_too() -> None:
    by_kind = {"parameter": 1, "attribute": 1}
    compared = Fingerprint(
        model_class="Draft", tensors=7, compared=9, differ=2, differ_names=["a", "b"], differ_by_kind=by_kind, moved=0,
        packed=3, packed_discarded=1,
    )  # fmt: skip
    data = compared.to_dict()
    assert data["class"] == "Draft" and "model_class" not in data
    assert Fingerprint.from_dict(data) == compared and compared.not_restored == 3
    fresh = Fingerprint(model_class="Draft", tensors=7).to_dict()
    assert "differ" not in fresh and "moved" not in fresh
    assert Fingerprint.from_dict(fresh) == Fingerprint(model_class="Draft", tensors=7)
    old = Fingerprint.from_dict({"present": True, "class": "X", "tensors": 7, "all_zero": 5, "unknown_key": 1})
    assert old is not None and not old.compares and old.not_restored == 0 and old.all_zero == 5
    assert Fingerprint.from_dict({"present": False}) == Fingerprint(present=False)
    assert Fingerprint(present=False).to_dict() == {"present": False}
    assert Fingerprint.from_dict("garbage") is None
    assert old.version == 1 and old.differ_how == {}  # an answer without a version compared Σ|x|
    how = {"a": protocol.SIGNS, "b": protocol.REARRANGED}
    named = replace(compared, version=protocol.FINGERPRINT_VERSION, differ_how=how, differ_by_how={"signs": 1})
    assert Fingerprint.from_dict(named.to_dict()) == named
    assert "differ_how" not in fresh and "by_sums" not in fresh


def test_a_discard_answer_counts_by_model_and_older_answers_count_nothing() -> None:
    answer = DiscardAnswer.from_dict({"fill": "zero", "filled_elements": 10, "draft_present": True,
                                      "target": {"parameter": 3, "buffer_kept": 1}})  # fmt: skip
    assert answer is not None and set(answer.models) == {"target"} and answer.models["target"].parameter == 3
    assert DiscardAnswer.from_dict(answer.to_dict()) == answer
    assert DiscardAnswer.from_dict({"filled_tensors": 10}) is None


def test_memory_reads_cpu_and_gpu_answers() -> None:
    assert Memory.from_dict({"device": "cpu", "free_bytes": None, "total_bytes": None}).free_bytes is None
    assert Memory.from_dict({"device": "cuda:0", "free_bytes": 5, "total_bytes": 9}) == Memory("cuda:0", 5, 9)
