"""Why no scenario runs vLLM's --sleep-mode-offload-cudagraph, held against the sources of every release the `gpu`
extra allows (read statically: a GPU wheel cannot be imported here).

The flag was once a variant of eagle3-graphed.toml, as a candidate mitigation for vLLM #55013 (an illegal memory
access at the drafter's graph replay after an L2 wake). It cannot be one: without it a sleep never touches CUDA graph
memory, and with it the graph pool is backed up and put back at the same addresses, so what a replay reads after the
wake is the same either way. At TP>1 it also changes how captured all-reduces run, so its tok/s is not comparable
with the reference fix's. If a release changes any of this, a test here fails and the decision is to be made again.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.helpers.releases import release_tree, supported_releases

FLAG = "--sleep-mode-offload-cudagraph"


def module(version: str, path: str) -> ast.Module:
    return ast.parse((release_tree(version) / "vllm" / path).read_text(encoding="utf-8"))


def function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    """`Class.method` or `function`, at module level."""
    *owner, name = qualname.split(".")
    scope: list[ast.stmt] = tree.body
    if owner:
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner[0]]
        scope = cls.body
    (found,) = [n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name]
    return found


def names(node: ast.AST) -> set[str]:
    """Every identifier and attribute name under `node`."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute):
            found.add(n.attr)
    return found


def calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls of `name` or `<anything>.name` under `node`."""
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Name) and n.func.id == name)
            or (isinstance(n.func, ast.Attribute) and n.func.attr == name)
        )
    ]


def constants(node: ast.AST) -> set[object]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}


@pytest.fixture(params=supported_releases())
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_no_shipped_scenario_runs_the_flag() -> None:
    """The decision. Every other test here is a fact it rests on."""
    scenarios = sorted((REPO / "scenarios").rglob("*.toml"))
    assert scenarios
    assert [p.name for p in scenarios if FLAG in p.read_text().split("\nname = ", 1)[-1]] == []
    header = (REPO / "scenarios" / "eagle3-graphed.toml").read_text().split("[server]")[0]
    assert FLAG in header and "cannot test a #55013 mitigation" in header  # the header says why


def test_the_flag_exists_and_is_what_moves_graphs_into_cumem(version: str) -> None:
    args = module(version, "engine/arg_utils.py")
    assert FLAG in constants(args)
    config = module(version, "config/vllm.py")
    prop = function(config, "VllmConfig.use_cumem_cudagraph_pool")
    assert {"sleep_mode_offload_cudagraph", "enable_sleep_mode", "sleep_mode_backend"} <= names(prop)


def test_graphs_go_to_cumem_only_under_the_flag(version: str) -> None:
    """The only capture into cuMem's graph pool is capture_pool's branch taken under use_cumem_cudagraph_pool; its
    other branch captures into torch's own graph pool, which cuMem never sees."""
    tree = release_tree(version) / "vllm"
    users = sorted(
        str(p.relative_to(tree)) for p in tree.rglob("*.py") if ".cudagraph_pool()" in p.read_text(encoding="utf-8")
    )
    assert users == ["compilation/cudagraph_pool.py"]
    capture = function(module(version, "compilation/cudagraph_pool.py"), "capture_pool")
    (branch,) = [n for n in ast.walk(capture) if isinstance(n, ast.If) and calls(n, "cudagraph_pool")]
    assert "use_cumem_cudagraph_pool" in names(branch.test)
    assert all(not calls(stmt, "cudagraph_pool") for stmt in branch.orelse)
    assert any(calls(stmt, "graph_pool_handle") for stmt in branch.orelse)


def test_sleep_and_wake_touch_only_cumem_allocations(version: str) -> None:
    """The worker's sleep and wake name nothing about graphs; they go through the sleep backend, whose cuMem
    allocator walks only the allocations it made (pointer_to_data)."""
    worker = module(version, "v1/worker/gpu_worker.py")
    for method, step in (("sleep", "suspend"), ("wake_up", "resume")):
        body = function(worker, f"Worker.{method}")
        assert not [n for n in names(body) if "graph" in n.lower()], method
        assert calls(body, step), method
    allocator = module(version, "device_allocator/cumem.py")
    for method in ("sleep", "wake_up"):
        loops = [n for n in ast.walk(function(allocator, f"CuMemAllocator.{method}")) if isinstance(n, ast.For)]
        assert [ast.unparse(n.iter) for n in loops] == ["self.pointer_to_data.items()"], method


def offloaded_tags(suspend: ast.FunctionDef) -> list[set[object]]:
    """Every tag set the backend's suspend can hand the allocator's sleep (one per assignment that may reach the call):
    written in the call, or held by a name the body assigns, where `(*name, ...)` keeps what the name held. Raises
    unless the call is a statement of the body itself, which every suspend runs."""
    (sleep,) = calls(suspend, "sleep")
    assert any(isinstance(s, ast.Expr) and s.value is sleep for s in suspend.body), ast.unparse(suspend)
    given = next((k.value for k in sleep.keywords if k.arg == "offload_tags"), sleep.args[0] if sleep.args else None)
    assert given is not None, ast.unparse(sleep)
    if not isinstance(given, ast.Name):
        return [constants(given)]
    held: list[set[object]] = []
    for node in ast.walk(suspend):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == given.id for t in targets) and node.value is not None:
            kept = any(isinstance(s, ast.Starred) and names(s) == {given.id} for s in ast.walk(node.value))
            held.append(constants(node.value) | (held[0] if kept and held else set()))
    return held


def test_a_sleep_backs_the_graph_pool_up_and_the_wake_puts_it_back_in_place(version: str) -> None:
    """Under the flag: the "cudagraph" tag is offloaded at every level (not only level 1, where weights are), and the
    wake copies each backup into the same pointer it was taken from. (0.32 and 0.33 name the tags in a variable that
    level 1 extends with "weights"; 0.34 offloads weights too, less the parameters a level-2 wake rewrites, which it
    passes apart.)"""
    suspend = function(module(version, "device_allocator/sleep_mode_backend.py"), "CuMemBackend.suspend")
    tags = offloaded_tags(suspend)
    assert tags and all("cudagraph" in t for t in tags), (tags, ast.unparse(suspend))
    wake = function(module(version, "device_allocator/cumem.py"), "CuMemAllocator.wake_up")
    (loop,) = [n for n in ast.walk(wake) if isinstance(n, ast.For)]
    assert isinstance(loop.target, ast.Tuple) and isinstance(loop.target.elts[0], ast.Name)
    pointer = loop.target.elts[0].id
    restores = [c for c in calls(loop, "cudaMemcpy") if isinstance(c.args[0], ast.Name) and c.args[0].id == pointer]
    assert restores and calls(loop, "create_and_map")


def test_the_flag_changes_how_captured_all_reduces_run(version: str) -> None:
    """Custom all-reduce stops registering graph buffers (each captured all-reduce copies into its IPC buffer
    instead), and NCCL's graph registration is turned off: TP>1 speed is not the reference fix's."""
    comm = module(version, "distributed/device_communicators/cuda_communicator.py")
    init = function(comm, "CudaCommunicator.__init__")
    (register,) = [
        n for n in ast.walk(init) if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["register"]
    ]
    assert "use_cumem_cudagraph_pool" in names(register.value) and "not " in ast.unparse(register.value)
    (custom,) = calls(init, "CustomAllreduce")
    assert {k.arg: ast.unparse(k.value) for k in custom.keywords}["register_graph_buffers"] == "register"
    reduce = module(version, "distributed/device_communicators/custom_all_reduce.py")
    kept = [ast.unparse(n) for n in ast.walk(function(reduce, "CustomAllreduce.__init__")) if isinstance(n, ast.Assign)]
    assert "self._capture_registered = register_graph_buffers" in kept
    captured = function(reduce, "CustomAllreduce.custom_all_reduce")
    registered = {
        ast.unparse(k.value) for c in calls(captured, "all_reduce") for k in c.keywords if k.arg == "registered"
    }
    assert registered == {"self._capture_registered", "False"}  # under capture, and eagerly
    config = module(version, "config/vllm.py")
    guarded = [
        n
        for n in ast.walk(config)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "self.use_cumem_cudagraph_pool" and calls(n, "setdefault")
    ]
    assert [constants(c) for g in guarded for c in calls(g, "setdefault")] == [{"NCCL_GRAPH_REGISTER", "0"}]


# What eagle3-graphed.toml's header cites (0.33.0 lines, under vllm/) and what each cited range must hold.
CITED = [
    ("compilation/cudagraph_pool.py", 38, 45, "use_cumem_cudagraph_pool"),
    ("compilation/cudagraph_pool.py", 38, 45, "graph_pool_handle"),
    ("v1/worker/gpu_worker.py", 301, 339, "sleep_mode_backend.suspend(level)"),
    ("device_allocator/sleep_mode_backend.py", 127, 137, "allocator.sleep(offload_tags=offload_tags)"),
    ("device_allocator/sleep_mode_backend.py", 134, 134, '("runtime", "cudagraph")'),
    ("device_allocator/cumem.py", 233, 298, "for ptr, data in self.pointer_to_data.items()"),
    ("device_allocator/cumem.py", 345, 360, "libcudart.cudaMemcpy(ptr, cpu_ptr, size_in_bytes)"),
    ("config/vllm.py", 716, 728, "model_config.sleep_mode_offload_cudagraph"),
    ("config/vllm.py", 2330, 2333, '"NCCL_GRAPH_REGISTER", "0"'),
    ("distributed/device_communicators/cuda_communicator.py", 123, 165, "register_graph_buffers=register"),
    ("distributed/device_communicators/custom_all_reduce.py", 513, 553, "registered=self._capture_registered"),
]


@pytest.mark.parametrize(("path", "first", "last", "text"), CITED)
def test_the_header_cites_lines_that_hold_what_it_says(path: str, first: int, last: int, text: str) -> None:
    header = (REPO / "scenarios" / "eagle3-graphed.toml").read_text().split("[server]")[0]
    span = f"{first}-{last}" if last != first else f"{first}"
    assert f"{Path(path).name}:{span}" in header
    lines = (release_tree("0.33.0") / "vllm" / path).read_text(encoding="utf-8").splitlines()[first - 1 : last]
    assert text in "\n".join(lines)
