"""The GPU path held to the vLLM releases specwake is tested against, read from their sources.

The releases are specwake.prepare.releases.TESTED_RELEASES, one of each series that `pip install 'specwake[gpu]'` can
install. No GPU wheel can be installed here, so each release's Python files are downloaded once with pip into
specwake's cache (tests/helpers/releases.py) and read: each shipped patch is applied to the releases its header names,
exactly as specwake applies it (specwake.prepare.overlay.build_overlay), and every vLLM module, class, function and
method that specwake's worker code (specwake/worker/*: the extension, draft_load.py, the weight-transfer engine, the
config check) and the patched files use must exist in each release and accept the arguments passed
(tests/helpers/vllm_api.py). `make releases` (tests/helpers/release_check.py) runs the same checks on the newest
release on the registry too.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from specwake.prepare.memory import DEFAULT_UTILIZATION, KV_SIZED_BY, Claim, vllm_claim
from specwake.prepare.overlay import Overlay, build_overlay
from specwake.prepare.plan import DYNAMO_DISABLE, EXECUTOR_FLAG, START_METHOD, data_parallel_rank_flags
from specwake.prepare.releases import TESTED_RELEASES, release_at_least, series
from specwake.prepare.server_args import RESERVED_FLAGS
from specwake.prepare.variants import RELOAD_MODE, RELOAD_MODE_SINCE, RELOAD_MODES
from specwake.protocol import ADAPTIVE_FIELD, K_FIELD, METHOD_FIELD, SCHEDULE_FIELD
from specwake.worker.discard import ANY_DRAFT
from specwake.worker.validate import SCHEDULE_DROP
from tests.helpers.paths import REPO
from tests.helpers.procs import launch_env
from tests.helpers.release_check import (
    METRIC_NAMES,
    add_argument_flags,
    flags_passed,
    missing_metrics,
    patched_uses,
    server_flags,
    shipped_scenarios,
)
from tests.helpers.releases import (
    DOWNLOAD_TIMEOUT_S,
    PATCHES,
    gpu_requirement,
    patch_family,
    patch_header_releases,
    patches_for,
    release_tree,
    supported_releases,
)
from tests.helpers.vllm_api import V1_RUNNER, V2_RUNNER, check_uses, parsed

# a release's first test downloads it (pip's own limit: DOWNLOAD_TIMEOUT_S) and builds every overlay on it
pytestmark = pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 300)

WORKER = sorted((REPO / "specwake" / "worker").glob("*.py"))
RELEASES = supported_releases()


def allowed_series(requirement: str) -> set[tuple[int, int]]:
    """The (major, minor) release series a requirement admits, probed at X.Y.0 and X.Y.99."""
    spec = Requirement(requirement).specifier
    return {
        (major, minor)
        for major in range(0, 3)
        for minor in range(0, 100)
        if spec.contains(f"{major}.{minor}.0") or spec.contains(f"{major}.{minor}.99")
    }


def test_each_fix_has_a_patch_for_each_tested_series_which_are_the_series_the_gpu_extra_allows():
    """A fix is one patch per release series or one for several (draft-reload.diff and draft-reload-0.34.diff are
    the reference fix): together a family's headers name each tested series once, and name no release these tests
    do not apply them to."""
    tested = {series(v) for v in TESTED_RELEASES}
    requirement = gpu_requirement()
    assert tested == allowed_series(requirement), (
        f"TESTED_RELEASES {TESTED_RELEASES}; pyproject's gpu extra ({requirement}) allows the series "
        f"{sorted(allowed_series(requirement))}: test one release of each, and no other"
    )
    families: dict[str, list[Path]] = {}
    for patch in PATCHES:
        families.setdefault(patch_family(patch), []).append(patch)
    assert {"draft-reload", "draft-reload-engine0"} <= set(families), sorted(families)
    for family, patches in families.items():
        named = {p.name: patch_header_releases(p) for p in patches}
        untested = {name: [v for v in vs if v not in TESTED_RELEASES] for name, vs in named.items()}
        assert not any(untested.values()), f"{family}: headers name releases that are not tested: {untested}"
        covered = [series(v) for vs in named.values() for v in vs]
        assert sorted(covered) == sorted(tested), f"{family}: {named} must name each of {TESTED_RELEASES} once"


def test_every_shipped_scenario_applies_on_each_tested_release_a_patch_made_for_it():
    resolved = 0
    for scenario in shipped_scenarios():
        for variant in scenario.variants:
            if variant.patches is None:
                continue
            for release in TESTED_RELEASES:
                patch = variant.for_release(release).patch
                where = f"{scenario.file.relative_to(REPO)} variants.{variant.name} on vLLM {release}"
                assert patch is not None, f"{where}: no patch"
                assert release in patch_header_releases(patch), f"{where}: {patch.name} is not for it"
                resolved += 1
    assert resolved >= len(TESTED_RELEASES) * 10, resolved  # some 20 patched variants ship, each on each release


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, release_tree(request.param)


@pytest.fixture(scope="module")
def overlays(release, tmp_path_factory) -> dict[Path, Overlay]:
    """Each shipped patch made for the release (its header names it) applied by specwake's own overlay builder."""
    version, tree = release
    cache = tmp_path_factory.mktemp(f"overlays-{version}")
    return {patch: build_overlay(patch, tree / "vllm", version, cache) for patch in patches_for(version)}


def test_every_shipped_patch_applies(release, overlays):
    version, tree = release
    assert {patch_family(p) for p in overlays} == {patch_family(p) for p in PATCHES}, (
        f"a fix has no patch for {version}"
    )
    for patch, overlay in overlays.items():
        assert overlay.patched_files, f"{patch.name} changed nothing in vLLM {version}"
        for rel in overlay.patched_files:
            path = overlay.root / rel
            assert path.is_file() and not path.is_symlink(), f"{patch.name}: {rel} was not written"
            compile(path.read_bytes(), str(path), "exec")


def test_worker_code_uses_only_what_the_release_has(release):
    version, tree = release
    checked = 0
    for path in WORKER:
        report = check_uses(path.read_text(), tree)
        assert report.problems == [], f"{path.relative_to(REPO)} against vLLM {version}:\n" + "\n".join(report.problems)
        checked += report.checked
    assert checked > 90, f"only {checked} uses of vLLM were found in specwake/worker: the walk is broken"


def test_the_check_fails_a_call_that_no_model_runner_has(release):
    """The worker's `runner` is each model runner the release may run it on (V1 and V2 before 0.34, V2 from 0.34): a
    method none of them has, or one only the V1 runner has, is a finding on the releases concerned."""
    version, tree = release
    planted = "def reload(runner):\n    runner.get_model()\n    runner.reload_drafter_weights(weights_iterator=None)\n"
    runners = (V1_RUNNER, V2_RUNNER) if version in ("0.32.0", "0.33.0") else (V2_RUNNER,)
    found = check_uses(planted, tree).problems
    assert found == [f"line 3: {r} has no attribute reload_drafter_weights" for r in runners], (version, found)
    v1_only = "def run(runner):\n    return runner.drafter\n"  # the V1 runner's proposer; V2 has a `speculator`
    found = check_uses(v1_only, tree).problems
    assert found == [f"line 2: {V2_RUNNER} has no attribute drafter"], (version, found)
    if V1_RUNNER not in runners:
        assert not (tree / "vllm" / "v1" / "worker" / "gpu_model_runner.py").exists(), version


def test_patched_code_uses_only_what_the_release_has(release, overlays):
    version, tree = release
    for patch, overlay in overlays.items():
        report = patched_uses(overlay.root, overlay.patched_files, tree)  # the patched release
        assert report.problems == [], f"{patch.name} against vLLM {version}:\n" + "\n".join(report.problems)


def test_every_fallback_import_exists_in_some_release():
    """An import guarded by `except ImportError` may be missing from a release, but not from all of them: one that
    no release has is a typo that the fallback hides."""
    found: dict[tuple[str, str], set[str]] = {}
    for version in RELEASES:
        tree = release_tree(version)
        for path in WORKER:
            report = check_uses(path.read_text(), tree)
            for use in report.optional_missing:
                found.setdefault((path.name, use.what), set())
            for use in report.optional_found:
                found.setdefault((path.name, use.what), set()).add(version)
    nowhere = [f"{name}: {what}" for (name, what), versions in found.items() if not versions]
    assert nowhere == [], f"guarded imports that no release in {RELEASES} has:\n" + "\n".join(nowhere)


def _literal_values(module: ast.Module, annotation: ast.expr) -> set[str]:
    """The strings of a Literal annotation, through a module-level alias (`RejectionSampleMethod = Literal[...]`)."""
    if isinstance(annotation, ast.Name):
        (alias,) = [
            n.value for n in module.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == annotation.id
        ]
        annotation = alias
    return {c.value for c in ast.walk(annotation) if isinstance(c, ast.Constant) and isinstance(c.value, str)}


def test_the_speculative_config_guard_reads_the_releases_own_fields_and_schedule(release):
    """The fields specwake.prepare.speculation judges are SpeculativeConfig's (vllm/config/speculative.py), the
    rejection sampling methods it refuses are values of the release's field ("fly" since 0.33), and the K it reads
    at a batch size comes from the lookup the release's scheduler builds and indexes by the requests it schedules."""
    version, tree = release
    module = ast.parse((tree / "vllm" / "config" / "speculative.py").read_text())
    (config,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig"]
    fields = {ast.unparse(n.target): n for n in config.body if isinstance(n, ast.AnnAssign)}
    assert {METHOD_FIELD, ADAPTIVE_FIELD, K_FIELD, SCHEDULE_FIELD} <= set(fields), version
    methods = _literal_values(module, fields[METHOD_FIELD].annotation)
    assert "synthetic" in methods and ("fly" in methods) == (series(version) >= (0, 33)), (version, methods)
    assert {"standard", "block"} <= methods  # what a scenario may run instead
    scheduler = (tree / "vllm" / "v1" / "core" / "sched" / "scheduler.py").read_text()
    assert "build_dynamic_sd_schedule_lookup(\n" in scheduler and f"speculative_config.{SCHEDULE_FIELD}," in scheduler
    assert "self.dynamic_sd_lookup[\n                len(num_scheduled_tokens)\n            ]" in scheduler, version
    lookup = ast.parse((tree / "vllm" / "v1" / "spec_decode" / "dynamic" / "utils.py").read_text())
    (build,) = [
        n for n in lookup.body if isinstance(n, ast.FunctionDef) and n.name == "build_dynamic_sd_schedule_lookup"
    ]
    assert [a.arg for a in build.args.args] == [SCHEDULE_FIELD, "vllm_max_batch_size", "vllm_num_speculative_tokens"]


def test_data_parallelism_drops_a_batch_size_schedule_where_the_guard_says_so(release):
    """VllmConfig.__post_init__ calls SCHEDULE_DROP (vllm/config/vllm.py), which sets the schedule to None unless
    data_parallel_size <= 1 (or no schedule is set): vLLM then drafts num_speculative_tokens at every batch size, the K
    specwake.worker.validate reports for a data-parallel group (specwake.prepare.speculation)."""
    version, tree = release
    module = ast.parse((tree / "vllm" / "config" / "vllm.py").read_text())
    (config,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "VllmConfig"]
    methods = {n.name: n for n in config.body if isinstance(n, ast.FunctionDef)}
    assert SCHEDULE_DROP in methods, version
    first, *_, last = methods[SCHEDULE_DROP].body[1:]  # after `speculative_config = self.speculative_config`
    assert isinstance(first, ast.If) and [ast.unparse(s) for s in first.body] == ["return"], version
    assert "self.parallel_config.data_parallel_size <= 1" in ast.unparse(first.test), version
    assert ast.unparse(last) == f"speculative_config.{SCHEDULE_FIELD} = None", version
    called = [ast.unparse(s) for s in methods["__post_init__"].body if isinstance(s, ast.Expr)]
    assert f"self.{SCHEDULE_DROP}()" in called, version  # unconditionally, in the body of __post_init__


def test_every_flag_the_shipped_scenarios_start_a_server_with_is_the_releases(release):
    """What build_server_command passes for every shipped scenario and variant: the engine's flags and the API
    server's."""
    version, tree = release
    passed = flags_passed(shipped_scenarios())
    assert {"--speculative-config", "--worker-extension-cls", "--enable-sleep-mode", "--seed"} <= set(passed)
    known = server_flags(tree)  # read once: the release's argument modules are large
    unknown = {flag: where for flag, where in passed.items() if flag not in known}
    assert unknown == {}, f"vLLM {version} has no such flags: {unknown}"


def test_every_metric_name_specwake_reads_is_named_in_the_release(release):
    version, tree = release
    assert missing_metrics(tree) == [], version
    assert len(METRIC_NAMES) == 7


def test_the_data_parallel_flags_specwake_sets_or_reserves_are_the_releases_own(release):
    """server.load_balancing's flags (plan.data_parallel_rank_flags) and every data-parallel and multi-node flag a
    scenario may not set are flags of the release's argument parser (--headless is the server's own, in its
    launcher's parser), and the release refuses external balancing of a dense model."""
    version, tree = release
    source = (tree / "vllm" / "engine" / "arg_utils.py").read_text()
    defined = add_argument_flags(source)
    ours = {f for f in data_parallel_rank_flags(1, 2) if f.startswith("-")} | {"--data-parallel-size"}
    parallel = ("--data-parallel", "-dp", "--enable-expert", "-ep", "--nnodes", "-n", "--node-rank", "-r", "--master")
    reserved = {f for f in RESERVED_FLAGS if f.startswith(parallel)}
    assert len(reserved) >= 22 and ours <= reserved | {"--data-parallel-size"}
    assert not (ours | reserved) - defined, f"vLLM {version} has no {sorted((ours | reserved) - defined)}"
    assert "Non-MoE models do not support external data parallel mode" in source


def test_what_vllm_claims_of_a_gpu_and_when_it_refuses_free_memory_are_the_releases(release):
    """specwake.prepare.memory.vllm_claim, held to the release: its default gpu_memory_utilization (1 from 0.34, where
    the extensible KV cache is on by default, else 0.92), whether it refuses at startup a GPU whose free memory is
    below its claim (not with the extensible KV cache), and the flags that size the KV cache instead."""
    version, tree = release
    cache = (tree / "vllm" / "config" / "cache.py").read_text()
    request = (tree / "vllm" / "v1" / "worker" / "utils.py").read_text()
    request = request[request.index("def request_memory(") :]
    request = request[: request.index("\ndef ")]
    flags = add_argument_flags((tree / "vllm" / "engine" / "arg_utils.py").read_text())
    claim = vllm_claim(version, [])
    assert isinstance(claim, Claim) and set(KV_SIZED_BY) <= flags, version
    refusal = 'f"is less than desired GPU memory utilization "'
    assert refusal in request and "math.ceil(" in request and "init_snapshot.total_memory * " in request
    if claim.checks_free:  # before 0.34: a default of 0.92, and the free memory always checked
        assert f"gpu_memory_utilization: float = Field(default={DEFAULT_UTILIZATION}, gt=0, le=1)" in cache
        assert "enable_extensible_kv_cache" not in request and "--enable-extensible-kv-cache" not in flags
    else:  # 0.34: the default follows the extensible KV cache, which skips the check
        assert f"DEFAULT_GPU_MEMORY_UTILIZATION: ClassVar[float] = {DEFAULT_UTILIZATION}" in cache
        assert "if self.enable_extensible_kv_cache:\n            return 1.0" in cache and claim.fraction == 1.0
        guard = "init_snapshot.free_memory < requested_memory\n        and not cache_config.enable_extensible_kv_cache"
        assert guard in request and "--enable-extensible-kv-cache" in flags


def test_vllms_server_keeps_its_own_metric_names_and_ray_spells_them_as_specwake_reads(release):
    """specwake.run.measure.metrics.vllm_name: vLLM's Ray stat logger is used by nothing in vLLM itself (so `vllm
    serve`'s /metrics keeps `vllm:` names, also with the Ray executor), and it sanitizes a name to [a-zA-Z0-9_]."""
    version, tree = release
    users = [p for p in (tree / "vllm").rglob("*.py") if "RayPrometheusStatLogger" in p.read_text(errors="replace")]
    assert [p.relative_to(tree).as_posix() for p in users] == ["vllm/v1/metrics/ray_wrappers.py"], version
    wrappers = (tree / "vllm" / "v1" / "metrics" / "ray_wrappers.py").read_text()
    assert 're.sub(r"[^a-zA-Z0-9_]", "_", name)' in wrappers


def test_rays_workers_get_no_pythonpath_from_the_server_before_they_import_vllm(release):
    """specwake.prepare.variants.overlay_under_ray: a Ray worker's sys.path is the cluster's. vLLM 0.32 copies the
    variables its ray_env names (no PYTHONPATH) through a call to workers that have imported vLLM; 0.33 copies the
    driver's whole environment, but before the import only the variables its ray_env_utils names (no PYTHONPATH)."""
    version, tree = release
    pre_import = tree / "vllm" / "v1" / "executor" / "ray_env_utils.py"

    def constants(path: Path, prefix: str) -> set[str]:
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
            if any(getattr(t, "id", "").startswith(prefix) for t in targets) and node.value is not None:
                found |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        return found

    if pre_import.exists():
        before = constants(pre_import, "_RAY_WORKER_PRE_IMPORT_ENV_VARS")
        assert before and "PYTHONPATH" not in before, (version, before)
    else:
        copied = constants(tree / "vllm" / "ray" / "ray_env.py", "DEFAULT_")
        assert "VLLM_" in copied and not any("PYTHONPATH".startswith(c) for c in copied), (version, copied)
        executor = (tree / "vllm" / "v1" / "executor" / "ray_executor.py").read_text()
        assert '"update_environment_variables"' in executor


def module_path(tree: Path, module: str) -> Path | None:
    base = tree.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def imported_modules(tree: Path, start: str, within: str = "vllm.v1") -> dict[str, ast.Module]:
    """The modules under `within` that module `start` imports, at any depth and from anywhere in a file (a function's
    own imports too: the CPU worker imports some of its runners where it picks one), each parsed."""
    seen: dict[str, ast.Module] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        path = module_path(tree, name)
        if name in seen or path is None:
            continue
        seen[name] = parsed(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(seen[name]):
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                found = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            todo += [m for m in found if m == within or m.startswith(within + ".")]
    return seen


def compiled_by_simple_backend(module: ast.Module) -> list[str]:
    """The module's functions that torch.compile wraps with the platform's simple backend."""
    return [
        fn.name
        for fn in module.body
        if isinstance(fn, ast.FunctionDef)
        and any(ast.unparse(d).startswith("torch.compile(") and "simple_compile_backend" in ast.unparse(d)
                for d in fn.decorator_list)
    ]  # fmt: skip


def test_a_cpu_runners_logprobs_meet_helpers_compiled_by_inductor_which_torch_compile_off_leaves_plain(release):
    """specwake.prepare.plan.DYNAMO_DISABLE: a model runner the CPU worker builds computes a logprobs request's
    logprobs and ranks with helpers compiled with the platform's simple backend, which CPU's platform keeps at the
    default, Inductor; torch reads its off switch from the environment. Found wherever the release keeps them: 0.32
    and 0.33, the V1 sampler's rank count (v1/sample/ops/logprobs.py); 0.34, the logprob helpers of the CPU runner that
    needs no Triton (v1/worker/cpu/logprob.py; the x86 runner, the V2 GPU runner's subclass, computes them in Triton
    kernels, which the switch does not reach)."""
    version, tree = release
    vllm = tree / "vllm"
    reached = imported_modules(tree, "vllm.v1.worker.cpu_worker")
    helpers = {
        f"{name}.{fn}"
        for name, module in reached.items()
        if "logprob" in name.rpartition(".")[2]
        for fn in compiled_by_simple_backend(module)
    }
    called = {
        ast.unparse(node.func).rpartition(".")[2]
        for module in reached.values()
        for node in ast.walk(module)
        if isinstance(node, ast.Call)
    }
    met = sorted(h for h in helpers if h.rpartition(".")[2] in called)
    assert met, f"vLLM {version}: no logprobs helper compiled with simple_compile_backend under the CPU worker"
    assert 'simple_compile_backend: str = "inductor"' in (vllm / "platforms" / "interface.py").read_text()
    assert "simple_compile_backend" not in (vllm / "platforms" / "cpu.py").read_text(), version


def test_under_torchs_off_switch_torch_compile_hands_the_function_back_as_it_is():
    """specwake.prepare.plan.DYNAMO_DISABLE, the installed torch's half (the releases' half is the test above): with
    the switch on there is nothing left to compile."""
    compiled = (
        "import torch\nf = torch.compile(lambda x: x, backend='inductor')\n"
        "print(hasattr(f, '_torchdynamo_orig_callable'))"
    )
    for value, wrapped in (("1", "False"), ("0", "True")):
        env = {**launch_env(), DYNAMO_DISABLE: value}
        out = subprocess.run([sys.executable, "-c", compiled], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == wrapped, (value, out.stderr[-2000:])


def test_a_data_parallel_group_gets_worker_processes_unless_told_uni_which_engines_side_by_side_may_run(release):
    """specwake.prepare.plan.EXECUTOR_FLAG: the release picks the multiprocessing executor for any data-parallel group
    (world_size_across_dp, whatever the ranks per engine), accepts "uni" from the flag, starts one-process engines
    side by side itself, and its CPU platform turns "uni" into "mp" only with V1 multiprocessing on."""
    version, tree = release
    vllm = tree / "vllm"
    parallel = (vllm / "config" / "parallel.py").read_text()
    picks = parallel.index("if self.distributed_executor_backend is None and self.world_size_across_dp > 1:")
    assert 'backend: DistributedExecutorBackend = "mp"' in parallel[picks : picks + 400], version
    assert 'DistributedExecutorBackend = Literal["ray", "mp", "uni", "external_launcher"]' in parallel
    engines = (vllm / "v1" / "engine" / "utils.py").read_text()
    assert "with _configure_uniproc_startup_threads(executor_class, local_engine_count):" in engines
    assert "or current_platform.is_cpu()" in engines  # on CPU it leaves the engines' threads as they are
    cpu = (vllm / "platforms" / "cpu.py").read_text()
    forced = cpu.index('os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"')
    assert 'and parallel_config.distributed_executor_backend == "uni"' in cpu[forced : forced + 200]
    assert 'parallel_config.distributed_executor_backend = "mp"' in cpu[forced : forced + 500]
    assert f'"{EXECUTOR_FLAG}",' in (vllm / "engine" / "arg_utils.py").read_text()  # the server's own flag


def test_the_cpu_platform_sets_spawn_over_the_start_method_asked_which_every_engine_process_then_reads(release):
    """specwake.prepare.plan.START_METHOD and the launcher's keep_start_method (specwake/worker/serve.py): the CPU
    platform's config check, a classmethod of (cls, vllm_config) run when the server's config is made, writes spawn into
    the environment; the start method of the engine cores, the data-parallel coordinator and the workers is read from
    the environment after it, with nothing on a CPU machine forcing spawn."""
    version, tree = release
    vllm = tree / "vllm"
    cpu = ast.parse((vllm / "platforms" / "cpu.py").read_text())
    (platform,) = [n for n in cpu.body if isinstance(n, ast.ClassDef) and n.name == "CpuPlatform"]
    (check,) = [n for n in platform.body if isinstance(n, ast.FunctionDef) and n.name == "check_and_update_config"]
    assert [ast.unparse(d) for d in check.decorator_list] == ["classmethod"], version
    assert [a.arg for a in check.args.args] == ["cls", "vllm_config"], version
    assert f"os.environ['{START_METHOD}'] = 'spawn'" in ast.unparse(check), version
    assert "current_platform.check_and_update_config(self)" in (vllm / "config" / "vllm.py").read_text()
    system = (vllm / "utils" / "system_utils.py").read_text()
    context = system[system.index("def get_mp_context") :]
    context = context[: context.index("\ndef ")]
    assert f"mp_method = envs.{START_METHOD}" in context and "return multiprocessing.get_context(mp_method)" in context
    forced = system[system.index("def _maybe_force_spawn") : system.index("def get_mp_context")]
    assert "current_platform" not in forced and "is_cpu" not in forced, version  # no CPU reason to force spawn
    envs = (vllm / "envs.py").read_text()
    assert f'"{START_METHOD}": env_with_choices(' in envs and "value = os.getenv(env_name)" in envs, version
    for starter in ("v1/engine/utils.py", "v1/engine/coordinator.py", "v1/executor/multiproc_executor.py"):
        assert "context = get_mp_context()" in (vllm / starter).read_text(), (version, starter)


def _env_entry(envs: ast.Module, name: str) -> ast.Call | None:
    """The call that reads environment variable `name` in vllm/envs.py's table of variables, if the table has one."""
    for node in ast.walk(envs):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == name and isinstance(value, ast.Call):
                    return value
    return None


def _functions(path: Path) -> dict[str, str]:
    """A module's top-level functions, each as ast.unparse writes it."""
    return {n.name: ast.unparse(n) for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def test_the_reload_mode_specwake_refuses_is_read_by_the_releases_it_names_and_the_drafter_reloads_layerwise(release):
    """specwake.prepare.variants.RELOAD_MODE: from RELOAD_MODE_SINCE on, vllm/envs.py reads it with the choices
    RELOAD_MODES (case-sensitive, layerwise the default), and every in-place reload_weights begins and finishes its
    reload in that mode (start_reload / finish_reload, each branching on direct_reload_enabled); before, no file of
    the release names it. The drafter's reload in the shipped fix and specwake's push (draft_load.py) is layerwise
    whatever it says: the mixed reload specwake refuses."""
    version, tree = release
    vllm = tree / "vllm"
    if series(version) < series(RELOAD_MODE_SINCE):
        assert not [p for p in vllm.rglob("*.py") if RELOAD_MODE in p.read_text(errors="replace")], version
        return
    call = _env_entry(ast.parse((vllm / "envs.py").read_text()), RELOAD_MODE)
    assert call is not None and ast.unparse(call.func) == "env_with_choices", version
    name, default, choices = (ast.literal_eval(a) for a in call.args)
    assert (name, default, tuple(choices), call.keywords) == (RELOAD_MODE, "layerwise", RELOAD_MODES, []), version
    reload = vllm / "model_executor" / "model_loader" / "reload"
    direct = _functions(reload / "direct.py")["direct_reload_enabled"]
    assert direct.endswith(f"\n    return envs.{RELOAD_MODE} == 'direct'"), version
    lifecycle = _functions(reload / "lifecycle.py")
    assert "if direct_reload_enabled():\n        begin_direct_reload(model)" in lifecycle["start_reload"], version
    assert "initialize_layerwise_reload(model)" in lifecycle["start_reload"], version
    assert "if direct_reload_enabled():\n        finish_direct_reload(" in lifecycle["finish_reload"], version
    inplace = ast.unparse(ast.parse((reload / "inplace.py").read_text()))
    assert inplace.index("start_reload(model)") < inplace.index("finish_reload(model, model_config, device)"), version
    drafter = (REPO / "specwake" / "worker" / "draft_load.py").read_text()
    assert "initialize_layerwise_reload(draft_model)" in drafter and "finalize_layerwise_reload(" in drafter
    assert "start_reload" not in drafter and "direct_reload" not in drafter and RELOAD_MODE not in drafter


def _worker_methods(tree: Path) -> dict[str, str]:
    """The methods of the release's GPU Worker, each as ast.unparse writes it."""
    module = ast.parse(tree.joinpath("vllm", "v1", "worker", "gpu_worker.py").read_text())
    (worker,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Worker"]
    return {n.name: ast.unparse(n) for n in worker.body if isinstance(n, ast.FunctionDef)}


def test_a_preserve_pattern_that_names_no_parameter_fails_the_level_2_sleep_before_it_releases_memory(release):
    """scenarios/tiny-gpu.toml's preserve-typo, `crash` on every release: the Worker matches each preserve pattern
    against the sleep names and raises for one that matches none, but ANY_DRAFT; its sleep does so at level 2, before
    it suspends the allocator. From 0.34 the patterns only take storages out of what the sleep may discard, so no
    pattern loses more of the drafter than none does (why the header says no preserve can be made to collapse)."""
    version, tree = release
    methods = _worker_methods(tree)
    raising = "raise ValueError(f'No parameter matches sleep retention: {pattern}')"
    (matcher,) = [name for name, text in methods.items() if raising in text]
    text = methods[matcher]
    guard = f"if not matches and pattern != {ANY_DRAFT!r}:"
    assert guard in text and text.index(guard) < text.index(raising), version
    assert "matches = fnmatch_filter(" in text and "self._get_sleep_parameters(model)" in text, version
    sleep = methods["sleep"]
    assert "level == 2" in sleep and sleep.index(f"self.{matcher}(") < sleep.index(".suspend("), version
    if release_at_least(version, "0.34"):
        assert matcher == "_discardable_parameters", version
        assert text.endswith("return set(storage.values()) - preserved"), version


def test_an_unseen_model_class_is_inspected_by_a_module_function_which_the_launcher_may_run_in_process(release):
    """specwake.prepare.plan.INSPECT_IN_PROCESS and the launcher's inspect_models_in_process: the registry hands a
    function of no arguments to its module-level `_run_in_subprocess`, looked up by name when the inspection runs (so
    the launcher's replacement is the one called), and caches the answer itself; the subprocess loads vLLM's general
    plugins before it runs the function, and loading them twice is loading them once."""
    version, tree = release
    vllm = tree / "vllm"
    registry = ast.parse((vllm / "model_executor" / "models" / "registry.py").read_text())
    functions = {n.name: n for n in registry.body if isinstance(n, ast.FunctionDef)}
    assert [a.arg for a in functions["_run_in_subprocess"].args.args] == ["fn"], version
    (lazy,) = [n for n in registry.body if isinstance(n, ast.ClassDef) and n.name == "_LazyRegisteredModel"]
    (inspect,) = [n for n in lazy.body if isinstance(n, ast.FunctionDef) and n.name == "inspect_model_cls"]
    calls = [n for n in ast.walk(inspect) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    (handed,) = [c for c in calls if c.func.id == "_run_in_subprocess"]  # type: ignore[attr-defined]
    assert isinstance(handed.args[0], ast.Lambda) and not handed.args[0].args.args, version
    assert "self._save_modelinfo_to_cache(mi, module_hash)" in ast.unparse(inspect), version
    run = ast.unparse(functions["_run"])
    assert run.index("load_general_plugins()") < run.index("result = fn()"), version
    plugins = ast.parse((vllm / "plugins" / "__init__.py").read_text())
    (load,) = [n for n in plugins.body if isinstance(n, ast.FunctionDef) and n.name == "load_general_plugins"]
    guard = "global plugins_loaded\n    if plugins_loaded:\n        return\n    plugins_loaded = True"
    assert guard in ast.unparse(load), version


def test_a_checkout_of_vllm_is_checked_as_its_release_and_a_branch_that_renames_a_use_fails(tmp_path: Path) -> None:
    """`make releases TREE=PATH`, as a vLLM developer runs it on a branch: a git checkout of the newest tested release
    (its tag the newest reachable one) passes; a commit on top that renames a function specwake's worker code imports
    fails, with the name in its own failure line."""
    newest = TESTED_RELEASES[-1]
    checkout = tmp_path / "vllm"
    shutil.copytree(release_tree(newest) / "vllm", checkout / "vllm")
    (checkout / "vllm" / "_version.py").unlink()  # a build writes it; a checkout has none, its tag says the release
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "release"], ["tag", f"v{newest}"]):
        subprocess.run([*git, *step], check=True, capture_output=True)

    def release_check() -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tests.helpers.release_check", "--tree", str(checkout)]
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)

    ok = release_check()
    assert ok.returncode == 0 and f"(as {newest})" in ok.stdout and ok.stdout.rstrip().endswith("-> ok"), ok.stdout
    layerwise = checkout / "vllm" / "model_executor" / "model_loader" / "reload" / "layerwise.py"
    text = layerwise.read_text()
    assert text.count("def finalize_layerwise_reload(") == 1
    layerwise.write_text(text.replace("def finalize_layerwise_reload(", "def finish_layerwise_reload("))
    subprocess.run([*git, "commit", "-qam", "rename finalize_layerwise_reload"], check=True, capture_output=True)
    broken = release_check()
    assert broken.returncode == 1, broken.stdout + broken.stderr
    failures = [line for line in broken.stdout.splitlines() if line.startswith("  failed: ")]
    assert failures and any("finalize_layerwise_reload" in line for line in failures), broken.stdout
