"""The pure parts of `specwake bisect` (specwake/run/bisect/vllm_git.py): which changed files change the build itself,
which commit a dev build's version names, and where the search starts when `--good` is a tag off `--bad`'s history.
tests/component/test_bisect_history.py runs them on git histories; tests/e2e/test_bisect.py bisects a real one."""

from __future__ import annotations

import pytest

from specwake.errors import InputError
from specwake.run.bisect.vllm_git import Ref, built_from, foreign, range_start, release_tags

# Paths as vLLM's commits touch them: each is (path, whether it changes the installed build).
VLLM_PATHS = [
    ("vllm/v1/worker/gpu_model_runner.py", False),
    ("vllm/model_executor/model_loader/reload/inplace.py", False),
    ("tests/v1/spec_decode/test_eagle.py", False),
    ("tests/models/fixtures/mistral_small_3_chat.json", False),
    ("docs/features/spec_decode.md", False),
    ("examples/offline_inference/spec_decode.py", False),
    ("benchmarks/kernels/benchmark_moe.py", False),
    (".github/workflows/pre-commit.yml", False),
    (".buildkite/test-pipeline.yaml", False),
    (".buildkite/scripts/hardware_ci/run-cpu-test.sh", False),
    ("tools/install_deepgemm.sh", False),
    ("docker/Dockerfile", False),
    ("use_existing_torch.py", False),  # run by hand before a build; it rewrites requirements/ and pyproject.toml
    ("README.md", False),
    ("requirements/test.in", False),
    ("requirements/test/cuda.txt", False),
    ("requirements/rocm-test.txt", False),
    ("requirements/nightly_torch_test.txt", False),
    ("requirements/docs.txt", False),
    ("requirements/lint.txt", False),
    ("requirements/dev.txt", False),
    ("requirements-dev.txt", False),  # an older tree kept its lists at the root
    ("docs/requirements-docs.txt", False),
    ("csrc/attention/attention_kernels.cu", True),
    ("cmake/utils.cmake", True),
    ("CMakeLists.txt", True),
    ("setup.py", True),
    ("pyproject.toml", True),
    ("setup.cfg", True),
    ("MANIFEST.in", True),
    ("rust/Cargo.toml", True),
    ("requirements/common.txt", True),
    ("requirements/cuda.txt", True),
    ("requirements/build/cuda.txt", True),
    ("requirements/cpu-build.txt", True),
    ("requirements-cuda.txt", True),
    ("requirements.txt", True),
    ("vllm/_C.abi3.so", True),
    ("vllm/grpc/vllm_engine.proto", True),
    ("vllm/csrc/ops.cu", True),
    ("vllm/third_party/kernel.cpp", True),
    # package data is installed as it is: the overlay carries it, as a --patch carries it
    ("vllm/py.typed", False),
    ("vllm/model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H100.json", False),
    ("vllm/entrypoints/serve/instrumentator/static/swagger-ui.css", False),
    ("vllm/transformers_utils/chat_templates/template_basic.jinja", False),
]


def test_only_what_changes_the_installed_build_is_foreign() -> None:
    paths = [path for path, _ in VLLM_PATHS]
    assert foreign(paths) == [path for path, build in VLLM_PATHS if build]


def test_a_name_that_merely_starts_like_a_build_folder_is_not_one() -> None:
    assert (
        foreign(["csrcs/x.cu", "cmake_notes.md", "tests/csrc/test_ops.py", "vllm_tools/x.json", "setup.py.orig"]) == []
    )


@pytest.mark.parametrize(
    ("version", "sha"),
    [
        ("0.33.1.dev12+g0123abcd", "0123abcd"),  # a nightly wheel (setuptools-scm, no device suffix)
        ("0.11.1rc2.dev5+gabcdef12", "abcdef12"),
        ("0.11.1rc2.dev5+gabcdef12.d20251001", "abcdef12"),  # built from a dirty tree
        ("0.10.2rc2.dev40+g6c8a3c099.cu128", "6c8a3c099"),  # setup.py appends the device after a `.`
        ("0.11.1.dev5+gabcdef12.d20251001.precompiled", "abcdef12"),
        ("0.12.0.dev1+gABCDEF12-cpu", "abcdef12"),  # packaging normalises case and separators
        ("0.33.0", None),
        ("0.32.0+cpu", None),
        ("0.11.0+cu129", None),
        ("0.9.0+rocm700", None),
        ("0.11.1.dev0", None),  # a dev build made without git names no commit
        ("0.11.1.dev3+g12", None),  # too short to be a commit
        ("unknown", None),  # what the engine probe reports when vllm has no __version__
    ],
)
def test_a_dev_build_names_its_commit_in_its_version(version: str, sha: str | None) -> None:
    assert built_from(version) == sha


def test_a_release_is_looked_up_by_its_tag_without_the_device_suffix() -> None:
    assert release_tags("0.32.0+cpu")[0] == "v0.32.0" and "0.32.0" in release_tags("0.32.0+cpu")
    assert release_tags("0.33.0") == ["v0.33.0", "0.33.0"]


GOOD, BAD, FORK = Ref("v0.33.0", "a" * 40), Ref("main", "b" * 40), "c" * 40


def test_a_good_ancestor_of_bad_starts_the_search_itself() -> None:
    assert range_start(GOOD, BAD, GOOD.sha) == (GOOD.sha, "")


def test_a_release_tag_off_the_history_of_bad_is_replaced_by_the_merge_base_and_said() -> None:
    start, note = range_start(GOOD, BAD, FORK)
    assert start == FORK
    assert "--good v0.33.0 is not an ancestor of --bad main" in note and f"merge base {FORK[:10]}" in note


@pytest.mark.parametrize(
    ("good", "merge_base", "phrase"),
    [
        (GOOD, BAD.sha, "--good v0.33.0 is newer than --bad main"),  # bad is an ancestor of good: swapped
        (GOOD, None, "share no history"),
        (Ref("HEAD", BAD.sha), BAD.sha, "are the same commit"),
    ],
)
def test_no_range_to_search_is_bad_input(good: Ref, merge_base: str | None, phrase: str) -> None:
    with pytest.raises(InputError, match=phrase):
        range_start(good, BAD, merge_base)
