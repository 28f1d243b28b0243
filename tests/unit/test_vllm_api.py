"""tests/helpers/vllm_api.py, the reading that holds specwake's worker code and the reference patch to vLLM
releases (tests/e2e/test_releases.py): against a small vLLM-shaped tree written here, each kind of mismatch it must
name is named, and code that matches passes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers.vllm_api import V1_RUNNER, V2_RUNNER, check_uses

RELEASE = {
    "vllm/__init__.py": "__version__ = '9.9.9'\n",
    "vllm/config/__init__.py": "from .vllm import VllmConfig\nfrom .speculative import SpeculativeConfig\n",
    "vllm/config/vllm.py": """
        from dataclasses import dataclass
        from .speculative import SpeculativeConfig

        @dataclass
        class VllmConfig:
            speculative_config: SpeculativeConfig | None = None
            seed: int = 0
        """,
    "vllm/config/speculative.py": """
        from dataclasses import dataclass

        @dataclass
        class SpeculativeConfig:
            num_speculative_tokens: int = 1
            draft_model_config: object = None
        """,
    "vllm/loader.py": """
        def get_loader(load_config, *, strict=False):
            return Loader()

        class Loader:
            def __init__(self, load_config):
                self.load_config = load_config

            def load(self, model, weights, skip=None):
                pass

            @classmethod
            def from_name(cls, name):
                return cls(None)
        """,
    "vllm/v1/worker/gpu/model_runner.py": """
        class GPUModelRunner:
            def get_model(self):
                return self.model

            def reload_weights(self, weights_iterator=None, weights_path=None):
                pass
        """,
    "vllm/v1/worker/gpu_worker.py": """
        class Worker:
            def __init__(self, vllm_config):
                self.model_runner = None

            def reload_weights(self, weights_iterator=None):
                pass
        """,
    "vllm/engine.py": """
        class Engine:
            def __init__(self, config: "VllmConfig"):
                self.config = config

            def receive(self, update_info, *, timeout=None):
                pass
        """,
}


def write_release(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return write_release(tmp_path_factory.mktemp("release"), RELEASE)


def problems(code: str, tree: Path, **kw) -> list[str]:
    return check_uses(textwrap.dedent(code), tree, **kw).problems


def test_code_that_matches_the_release_passes(tree):
    code = """
        from vllm.config import VllmConfig, SpeculativeConfig
        from vllm.loader import Loader, get_loader

        def go(vllm_config):
            spec = vllm_config.speculative_config
            n = spec.num_speculative_tokens
            loader = get_loader(vllm_config, strict=True)
            Loader(vllm_config).load(None, [], skip=1)
            Loader.from_name("x").load(None, [])
            return SpeculativeConfig(num_speculative_tokens=n)
        """
    report = check_uses(textwrap.dedent(code), tree)
    assert report.problems == [] and report.checked >= 8


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("from vllm.nowhere import x\n", "release has no module vllm.nowhere"),
        ("from vllm.loader import get_loaders\n", "vllm.loader has no get_loaders"),
        ("import vllm.nowhere\n", "release has no such module"),
        ("from vllm.loader import get_loader\nget_loader(1, 2)\n", "takes 1 positional arguments, the call passes 2"),
        ("from vllm.loader import get_loader\nget_loader(1, lax=True)\n", "has no parameter lax"),
        ("from vllm.loader import get_loader\nget_loader()\n", "requires load_config"),
        ("from vllm.loader import Loader\nLoader(1).load(None)\n", "requires weights"),
        ("from vllm.loader import Loader\nLoader.from_name('a', 'b')\n", "the call passes 2"),
        ("from vllm.config import SpeculativeConfig\nSpeculativeConfig(k=3)\n", "has no field k"),
        ("def f(vllm_config):\n    return vllm_config.speculative\n", "VllmConfig has no attribute speculative"),
        (
            "def f(vllm_config):\n    spec = vllm_config.speculative_config\n    return spec.draft_model\n",
            "SpeculativeConfig has no attribute draft_model",
        ),
        (
            "from vllm.engine import Engine\nclass Mine(Engine):\n    def receive(self):\n        pass\n",
            "receive overrides vllm.engine.Engine.receive(self, update_info, timeout) but takes (self)",
        ),
        (
            "from vllm.engine import Engine\nclass Mine(Engine):\n    def go(self):\n        return self.confg\n",
            "Engine has no attribute confg",
        ),
    ],
)
def test_each_kind_of_mismatch_is_named(tree, code, expected):
    found = problems(code, tree)
    assert any(expected in p for p in found), found


def test_a_fallback_import_may_be_missing_but_its_alternative_may_not(tree):
    fallback = "try:\n    from vllm.new import thing\nexcept ImportError:  # vLLM < 10: not yet\n    thing = None\n"
    report = check_uses(fallback, tree)
    assert report.problems == [] and [u.what for u in report.optional_missing] == ["from vllm.new import thing"]
    both_missing = "try:\n    from vllm.new import thing\nexcept ImportError:  # vLLM < 10: moved\n"
    both_missing += "    from vllm.old import thing\n"
    assert any("vllm.old" in p for p in problems(both_missing, tree))
    first_there = "try:\n    from vllm.loader import Loader\nexcept ImportError:\n    from vllm.old import Loader\n"
    assert problems(first_there, tree) == []


def test_what_the_code_probes_first_and_what_a_subclass_adds_are_not_findings(tree):
    code = """
        from vllm.engine import Engine

        def f(vllm_config):
            if hasattr(vllm_config, "future_field"):
                return vllm_config.future_field

        class Mine(Engine):
            def __init__(self, config):
                super().__init__(config)
                self.extra = 1

            def go(self):
                return self.extra, self.config
        """
    assert problems(code, tree) == []


def test_only_the_lines_a_patch_changes_are_held_to_the_release(tree):
    code = "from vllm.nowhere import a\nfrom vllm.nowhere import b\n"
    assert len(problems(code, tree)) == 2
    assert problems(code, tree, lines={2}) == ["line 2: from vllm.nowhere import b: release has no module vllm.nowhere"]


def test_a_runner_is_every_model_runner_the_release_may_run_the_worker_on(tree):
    """A release from 0.34 on has one: the V2 runner (this tree is 9.9.9); so is the worker's model runner."""
    fine = "def f(runner):\n    runner.get_model()\n    runner.reload_weights(weights_iterator=[])\n"
    assert problems(fine, tree) == []
    planted = "def f(runner):\n    runner.reload_draft_weights()\n"
    assert problems(planted, tree) == [f"line 2: {V2_RUNNER} has no attribute reload_draft_weights"]

    through_the_worker = """
        def f(worker):
            runner = worker.model_runner
            runner.get_model()
            worker.reload_weights(weights_iterator=[])
            return runner.speculator
        """
    assert problems(through_the_worker, tree) == [f"line 6: {V2_RUNNER} has no attribute speculator"]


def test_a_class_the_release_lacks_fails_the_check_instead_of_going_unchecked(tmp_path):
    """Before 0.34 a runner may also be the V1 runner, which this tree lacks: every use fails, none is skipped."""
    older = write_release(tmp_path / "older", {**RELEASE, "vllm/__init__.py": "__version__ = '0.33.0'\n"})
    found = problems("def f(runner):\n    runner.get_model()\n", older)
    assert found == [
        f"line 1: parameter runner: vLLM 0.33.0 has no class {V1_RUNNER}",
        f"line 2: {V1_RUNNER}.get_model: vLLM 0.33.0 has no class {V1_RUNNER}",
    ]
    unversioned = write_release(tmp_path / "unversioned", {**RELEASE, "vllm/__init__.py": ""})
    found = problems("def f(runner):\n    runner.get_model()\n", unversioned)
    assert found == [
        "line 1: parameter runner: KNOWN_PARAMETERS names no class for vLLM (no __version__ in vllm/_version.py)"
    ]


def test_a_name_a_plain_class_only_annotates_is_no_member_and_a_fields_annotation_is(tmp_path):
    """A mixin's `get_model: Callable[...]` declares a type; only something that assigns or defines it makes it a
    member (vLLM's LoRA mixin and Model Runner V2). In a dataclass an annotation is a field."""
    files = dict(RELEASE)
    files["vllm/v1/worker/gpu/model_runner.py"] = """
        from dataclasses import dataclass
        from typing import Callable

        class LoRAMixin:
            get_model: Callable[[], object]
            lora_config: object

        class GPUModelRunner(LoRAMixin):
            def __init__(self):
                self.lora_config = None

            def reload_weights(self, weights_iterator=None, weights_path=None):
                pass

        @dataclass
        class Batch:
            size: int
        """
    tree = write_release(tmp_path / "release", files)
    code = """
        from vllm.v1.worker.gpu.model_runner import Batch, GPUModelRunner

        class Runner(GPUModelRunner):
            def go(self):
                return self.get_model(), self.lora_config, Batch(size=1)
        """
    found = problems(code, tree)
    assert found and all("GPUModelRunner has no attribute get_model" in p for p in found), found


@pytest.mark.parametrize(
    ("handler", "absent_allowed"),
    [
        ("except ImportError:", False),  # says nothing: the release must have it
        ("except ImportError:  # vLLM < 10.0: not yet there", True),  # 9.9.9 is one of those releases
        ("except ImportError:  # vLLM < 9.0: not yet there", False),  # 9.9.9 is not
        ("except ImportError:  # vLLM < 10.0", False),  # releases without a why
    ],
)
def test_a_guarded_import_may_be_absent_only_where_its_handler_says_why(tree, handler, absent_allowed):
    code = f"""
        try:
            from vllm.loader import load_faster
        {handler}
            load_faster = None
        """
    found = problems(code, tree)
    if absent_allowed:
        assert found == []
    else:
        assert len(found) == 1 and "vllm.loader has no load_faster; guarded by `except ImportError`" in found[0]


def test_the_alternative_of_an_import_the_release_has_is_never_needed(tree):
    code = """
        try:
            from vllm.loader import get_loader
        except ImportError:
            from vllm.old_loader import get_loader
        """
    assert problems(code, tree) == []
