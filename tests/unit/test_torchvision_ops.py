"""The install step that lets the registry's (CUDA) torchvision import beside torch's CPU build: it guards only the
unconditional fake-kernel registrations, is idempotent, and leaves every other line alone."""

from __future__ import annotations

from specwake.worker.torchvision_ops import MARK, guard

SOURCE = """import torchvision.extension


@register_meta("roi_align")
def meta_roi_align(input, rois):
    return input


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets


@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    return dets
"""


def test_guards_each_unconditional_registration_and_nothing_else() -> None:
    guarded, ops = guard(SOURCE)
    assert ops == ["torchvision::nms", "torchvision::qnms"]
    changed = [(a, b) for a, b in zip(SOURCE.splitlines(), guarded.splitlines(), strict=True) if a != b]
    assert [a for a, _ in changed] == [
        '@torch.library.register_fake("torchvision::nms")',
        '@torch.library.register_fake("torchvision::qnms")',
    ]
    assert all("if torchvision.extension._has_ops() else" in b and b.endswith(MARK) for _, b in changed)
    compile(guarded, "_meta_registrations.py", "exec")


def test_is_idempotent() -> None:
    once, _ = guard(SOURCE)
    twice, ops = guard(once)
    assert (twice, ops) == (once, [])
