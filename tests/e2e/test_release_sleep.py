"""What specwake's emulated discard and its weight push rely on in each release's sleep and reload code, read from the
releases' sources (tests/helpers/releases.py), so a release that changes it fails here rather than on a GPU.

- The discard rules (specwake.worker.discard): 0.32/0.33 save named buffers and preserved parameters and drop the
  weights pool; 0.34 saves nothing by name and drops only the allocations of discardable parameters' storages. Both
  name the drafter's own parameters `draft.<name>` and refuse a pattern that matches nothing but `draft.*`.
- The push's memory regime (specwake.worker.push): 0.34 caps torch's memory after warmup when the KV cache is
  extensible, and lifts the cap only inside `kv_cache_lent_for_weight_update`, which `Worker.reload_weights` enters
  for the target; specwake's push goes through that method for the target and takes the same loan for the drafter.
  0.32/0.33 have no such cap: `Worker.reload_weights` hands its keywords to the runner, which takes the iterator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specwake.protocol import release_rules
from tests.helpers.paths import REPO
from tests.helpers.releases import DOWNLOAD_TIMEOUT_S, release_tree, supported_releases

pytestmark = pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 120)  # a release's first test may download it

RELEASES = supported_releases()
WORKER = "vllm/v1/worker/gpu_worker.py"
KV_CACHE = "vllm/v1/worker/extensible_kv_cache.py"
PUSH = REPO / "specwake" / "worker" / "push.py"
LOAN = "kv_cache_lent_for_weight_update"


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> tuple[str, Path]:
    version = request.param[0] if isinstance(request.param, tuple) else request.param
    return version, release_tree(version)


# The tested releases by the level-2 rules they follow (specwake.protocol.release_rules): each test of a rule runs on
# exactly the releases that follow it.
BY_RULES = {rules: [r for r in RELEASES if release_rules(r) == rules] for rules in ("0.33", "0.34")}
assert all(BY_RULES.values()), BY_RULES  # each rule is some tested release's


def under(rules: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("release", [(r, None) for r in BY_RULES[rules]], indirect=["release"], ids=str)


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def function(module: ast.Module, name: str, within: str | None = None) -> ast.FunctionDef:
    """A module's function, or a method of one of its classes."""
    scope: list[ast.stmt] = module.body
    if within is not None:
        scope = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == within).body
    found = [n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"no {within + '.' if within else ''}{name}"
    return found[0]


def calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls in `node` of a function or method so named (`f(...)`, `x.f(...)`)."""

    def called(call: ast.Call) -> str | None:
        return getattr(call.func, "id", None) or getattr(call.func, "attr", None)

    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and called(n) == name]


def source(node: ast.AST) -> str:
    return ast.unparse(node)


def parameters(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]


# -- the L2 discard ---------------------------------------------------------------------------------------------------


def test_each_release_names_the_drafters_own_parameters_draft_dot_name(release):
    version, tree = release
    named = source(function(parsed(tree / WORKER), "_get_sleep_parameters", "Worker"))
    assert "model.named_parameters()" in named and "self.get_draft_model()" in named
    assert "f'draft.{name}'" in named and "id(parameter) not in shared" in named


@under("0.33")
def test_the_033_rules_are_0_32_and_0_33s_sleep(release):
    """Buffers of both models and preserved parameters saved by name before the sleep and written back on wake; the
    weights pool offloaded at level 1 only (so dropped at level 2)."""
    version, tree = release
    module = parsed(tree / WORKER)
    sleep, wake = (source(function(module, name, "Worker")) for name in ("sleep", "wake_up"))
    assert "self._save_sleep_parameters(model)" in sleep
    assert "model.named_buffers()" in sleep and "draft.named_buffers()" in sleep
    assert "self._restore_sleep_parameters(" in wake and "buffer.data.copy_(" in wake
    save = source(function(module, "_save_sleep_parameters", "Worker"))
    assert "fnmatch_filter(parameters, pattern)" in save and "pattern != 'draft.*'" in save
    assert "No parameter matches sleep retention" in save
    backend = source(function(parsed(tree / "vllm/device_allocator/sleep_mode_backend.py"), "suspend", "CuMemBackend"))
    assert "offload_tags: tuple[str, ...] = ('runtime', 'cudagraph')" in backend
    assert "if level == 1:" in backend and "offload_tags = ('weights', *offload_tags)" in backend


@under("0.34")
def test_the_034_rules_are_0_34s_sleep(release):
    """Nothing saved by name; the storages of the discardable parameters (preserved ones taken out by storage) passed
    to the allocator, which drops a weights allocation only when all its live blocks start at one of them."""
    version, tree = release
    module = parsed(tree / WORKER)
    assert "_sleep_saved" not in (tree / WORKER).read_text()
    discardable = source(function(module, "_discardable_parameters", "Worker"))
    assert "parameter.untyped_storage().data_ptr()" in discardable
    assert "fnmatch_filter(storage, pattern)" in discardable and "pattern != 'draft.*'" in discardable
    assert "No parameter matches sleep retention" in discardable
    assert "return set(storage.values()) - preserved" in discardable
    sleep = source(function(module, "sleep", "Worker"))
    assert "self._discardable_parameters(self.model_runner.model) if level == 2 else set()" in sleep
    assert "self.sleep_mode_backend.suspend(discardable)" in sleep
    allocations = source(function(parsed(tree / "vllm/device_allocator/__init__.py"), "discardable_allocations"))
    assert "allocator_and_pools.get('weights', ())" in allocations
    assert "block['state'] == 'inactive' or block['address'] in tensors" in allocations
    backend = source(function(parsed(tree / "vllm/device_allocator/sleep_mode_backend.py"), "suspend", "CuMemBackend"))
    assert "('weights', 'runtime', 'cudagraph'), discardable" in backend
    cumem = source(function(parsed(tree / "vllm/device_allocator/cumem.py"), "sleep", "CuMemAllocator"))
    assert "offload = data.tag in offload_tags and ptr not in discarded" in cumem


# -- the push under vLLM's memory regime for weight updates -----------------------------------------------------------


@under("0.33")
def test_before_0_34_there_is_no_cap_and_the_workers_reload_hands_the_iterator_on(release):
    version, tree = release
    assert not (tree / KV_CACHE).exists(), version
    assert LOAN not in (tree / WORKER).read_text()
    reload = function(parsed(tree / WORKER), "reload_weights", "Worker")
    assert source(reload.body[-1]).endswith("self.model_runner.reload_weights(*args, **kwargs)")
    runner = function(parsed(tree / "vllm/v1/worker/gpu_model_runner.py"), "reload_weights", "GPUModelRunner")
    assert "weights_iterator" in parameters(runner)


@under("0.34")
def test_0_34_lifts_the_cap_for_its_own_reload_only_inside_the_loan_specwakes_push_takes(release):
    """The cap: set after warmup by measure_kv_cache_blocks, lifted inside the loan. The worker's reload_weights
    takes the loan for the target, checkpoint-format weights failing when short; specwake's push calls that method
    for the target and takes the same loan, with the same arguments, for the drafter."""
    version, tree = release
    assert (tree / KV_CACHE).is_file(), version
    cache = parsed(tree / KV_CACHE)
    assert calls(function(cache, "measure_kv_cache_blocks"), "set_torch_memory_limit")
    loan = function(cache, LOAN)
    assert [source(d) for d in loan.decorator_list] == ["contextmanager"]
    assert parameters(loan) == ["kv_cache", "model", "reclaimable", "fail_if_short"]
    assert [a.arg for a in loan.args.kwonlyargs] == ["reclaimable", "fail_if_short"]
    assert "kv_cache.set_torch_memory_limit(None)" in source(loan)

    module = parsed(tree / WORKER)
    assert "self._kv_cache_reclaimable = False" in source(function(module, "__init__", "Worker"))
    reload = function(module, "reload_weights", "Worker")
    assert parameters(reload)[:3] == ["self", "weights_iterator", "weights_path"]
    (theirs,) = calls(reload, LOAN)
    with_block = next(n for n in ast.walk(reload) if isinstance(n, ast.With))
    assert "kv_cache_loan" in source(with_block.items[0].context_expr)
    assert calls(with_block, "reload_weights"), "the runner's reload runs inside the loan"
    runner = parsed(tree / "vllm/v1/worker/gpu/model_runner.py")
    assert "self.extensible_kv_cache: ExtensibleKVCache | None = None" in source(
        function(runner, "initialize_kv_cache", "GPUModelRunner")
    )

    (ours,) = calls(parsed(PUSH), LOAN)
    assert source(theirs.args[0]) == source(ours.args[0]).replace("worker.", "self.")
    assert {k.arg for k in theirs.keywords} == {k.arg for k in ours.keywords} == {"reclaimable", "fail_if_short"}
    keyword = {k.arg: source(k.value) for k in ours.keywords}
    assert {k.arg: source(k.value) for k in theirs.keywords}["fail_if_short"] == keyword["fail_if_short"]
    assert "_kv_cache_reclaimable" in keyword["reclaimable"]
    target = function(parsed(PUSH), "push_target")
    assert [source(c.func) for c in calls(target, "reload_weights")] == ["worker.reload_weights"]
