"""Scenario TOML texts shared by tests/unit/test_scenario.py (the loader) and tests/component/test_hostile_input.py (the
CLI): MINIMAL, the smallest valid scenario, and BAD, malformed ones as (text, key the error names, phrase it
contains); and `cpu_pair`, the tables of a real CPU server that e2e scenarios share.
"""

from __future__ import annotations

MINIMAL = """
[server]
model = "builtin:tiny-llama"
[speculative]
method = "draft_model"
model = "builtin:tiny-llama"
num_speculative_tokens = 3
"""


def cpu_pair(model: str, method: str, draft: str, startup_timeout_s: int = 300) -> str:
    """The [server] and [speculative] tables of a builtin pair as the shipped scenarios/cpu/*.toml serve it, small and
    fast on a CPU: what e2e scenarios that vary the patch share (tests/e2e/test_fooled.py, test_runners.py,
    test_strict.py, test_uncovered.py)."""
    return f"""\
[server]
model = "{model}"
enforce_eager = true
dtype = "float32"
max_model_len = 512
args = ["--seed", "0", "--max-num-seqs", "4", "--num-gpu-blocks-override", "256"]
env = {{ HF_HUB_OFFLINE = "1" }}
startup_timeout_s = {startup_timeout_s}
[speculative]
method = "{method}"
model = "{draft}"
num_speculative_tokens = 3
"""


TINY_DRAFT_MODEL = cpu_pair("builtin:tiny-llama", "draft_model", "builtin:tiny-llama-draft")
EAGLE3 = cpu_pair("builtin:eagle3-llama", "eagle3", "builtin:eagle3-llama-draft")

BAD = [
    ("[server\nmodel=1", "", "invalid TOML"),
    ("[speculative]\nmethod='x'", "server", "is required"),
    (MINIMAL + "[workload]\nmax_tokens = 0\n", "workload.max_tokens", "greater than 0"),
    (MINIMAL + "[workload]\nmax_tokens = '5'\n", "workload.max_tokens", "integer"),
    (MINIMAL + "[workload]\nmaxtokens = 5\n", "workload.maxtokens", "did you mean 'max_tokens'"),
    (MINIMAL + "[workload]\nrepeats = -1\n", "workload.repeats", "greater than 0"),
    (MINIMAL + "[workload]\nprompts = []\n", "workload.prompts", "non-empty"),
    (MINIMAL + "[workload]\nprompts = 'missing.txt'\n", "workload.prompts", "not found"),
    (MINIMAL + "[workload]\nprompts = 'builtin:nope'\n", "workload.prompts", "unknown builtin"),
    (MINIMAL + "[cycle]\nlevel = 3\n", "cycle.level", "1 or 2"),
    (MINIMAL + "[cycle]\ncount = 0\n", "cycle.count", "greater than or equal to 1"),
    (
        MINIMAL + "[cycle]\ndiscard = 'sometimes'\n",
        "cycle.discard",
        "'auto', 'native' or 'emulated'",
    ),
    (
        MINIMAL.replace("[server]", "[server]\ntensor_parallel_size = 0"),
        "server.tensor_parallel_size",
        "greater than or equal to 1",
    ),
    (MINIMAL.replace("[server]", "[server]\nargs = '--seed 0'"), "server.args", "list of strings"),
    (
        MINIMAL.replace("[server]", "[server]\nargs = ['--port', '1']"),
        "server.args",
        "'--port' is set by specwake",
    ),
    (
        MINIMAL.replace("[server]", "[server]\nargs = ['--host=0.0.0.0']"),
        "server.args",
        "'--host' is set by specwake",
    ),
    (
        MINIMAL.replace("[server]", "[server]\nargs = ['--worker-extension-cls', 'x.Y']"),
        "server.args",
        "set by specwake",
    ),
    (MINIMAL.replace("[server]", "[server]\nenv = { A = 1 }"), "server.env", "must be a string"),
    (MINIMAL.replace("[server]", "[server]\nmodle = 'x'"), "server.modle", "did you mean 'model'"),
    (MINIMAL + "[expect]\nbaseline = 'fine'\n", "expect.baseline", "recover, collapse, corrupt, crash, any"),
    (MINIMAL + "[expect]\npached = 'recover'\n", "expect.pached", "no variant named"),
    (MINIMAL + "[expect]\ntolerance = 2\n", "expect.tolerance", "[0, 1)"),
    (MINIMAL + "[variants.patched]\npatch = 'nope.diff'\n", "variants.patched.patch", "not found"),
    (MINIMAL + "[variants.'bad name']\n", "variants", "may use only"),
    (MINIMAL + "[variants.baseline]\ncolour = 'red'\n", "variants.baseline.colour", "unknown key"),
    (MINIMAL.replace('method = "draft_model"', ""), "speculative", "method"),
    (
        MINIMAL.replace("num_speculative_tokens = 3", "num_speculative_tokens = 0"),
        "speculative",
        ">= 1",
    ),
    ("surprise = 1\n" + MINIMAL, "surprise", "unknown key"),
    (MINIMAL + "[cycle]\ncycles = 2\n", "cycle.cycles", "unknown key (did you mean 'count'?)"),
    (  # every problem is named, not "(+1 more problem)"
        MINIMAL + "[cycle]\ncount = 0\ndiscard_fill = 'ones'\n",
        "cycle.count",
        "; cycle.discard_fill: Input should be 'zero', 'nan' or 'random'",
    ),
    (MINIMAL + "[cycle]\nlevel = [1, 1]\n", "cycle.level: ", "distinct"),
    (MINIMAL + "[cycle]\nlevel = [3]\n", "cycle.level: ", "1 or 2"),
    (MINIMAL + "[cycle]\nreload = 'pull'\n", "cycle.reload", "'reload_weights', 'push' or 'weight_transfer'"),
    (MINIMAL + "[cycle]\npush_to = ['trainer']\n", "cycle.push_to", "'target' or 'draft'"),
    (MINIMAL + "[cycle]\npush_to = []\n", "cycle.push_to", "one or more distinct"),
    (MINIMAL + "[cycle]\ndiscard_fill = 'ones'\n", "cycle.discard_fill", "'zero', 'nan' or 'random'"),
    (MINIMAL + "[expect]\nmax_wake_s = -1\n", "expect.max_wake_s", "(0, inf)"),
    (MINIMAL + "[expect]\nmax_rss_growth_mb = 'lots'\n", "expect.max_rss_growth_mb", "must be a number"),
    (MINIMAL + "[expect]\nmax_logprob_drift = -0.1\n", "expect.max_logprob_drift", "[0, inf)"),
    (MINIMAL + "[variants.v]\npush_scale = { a = 'x' }\n", "variants.v.push_scale.a", "valid number"),
    (MINIMAL + "[variants.v]\npush_to = ['target', 'target']\n", "variants.v.push_to", "distinct"),
    (MINIMAL + "[variants.v]\nargs = ['--port=1']\n", "variants.v.args", "set by specwake"),
    (MINIMAL + "[variants.f]\nspeculative = false\n[expect]\nf = 'recover'\n", "expect.f", "not judged"),
    (MINIMAL + "[expect]\nmin_speedup_recovery = 0\n", "expect.min_speedup_recovery", "in (0, 1.5)"),
    (MINIMAL + "[expect]\nbaseline-L2 = 'collapse'\n", "expect.baseline-L2", "no variant named"),
    (MINIMAL + "[cycle]\npush_to = ['draft']\n", "cycle.push_to", 'only with cycle.reload = "push"'),
    (MINIMAL + "[variants.baseline]\npush_scale = { 'x' = 2.0 }\n", "variants.baseline.push_scale", "only with"),
    (MINIMAL + "[variants.baseline]\npush_skip = ['x']\n", "variants.baseline.push_skip", "only with"),
    (
        MINIMAL + "[cycle]\nreload = 'weight_transfer'\n[variants.v]\npush_scale = { 'draft:x' = 2.0 }\n",
        "variants.v.push_scale",
        "'draft:x' is for the draft model, which this variant never syncs (push_to = ['target'])",
    ),
    (
        MINIMAL + "[cycle]\nreload = 'push'\n[variants.v]\npush_skip = ['drafter:x']\n",
        "variants.v.push_skip",
        "'drafter:x': only target: or draft: may come before a tensor name",
    ),
    (MINIMAL + "[cycle]\nreload = 'push'\n[variants.v]\npush_skip = ['x', 'x']\n", "variants.v.push_skip", "twice"),
    (
        MINIMAL.replace("[server]", "[server]\nargs = ['--weight-transfer-config', '{}']")
        + "[cycle]\nreload = 'weight_transfer'\n",
        "server.args",
        '--weight-transfer-config is set by specwake with cycle.reload = "weight_transfer"',
    ),
    (
        MINIMAL
        + "[cycle]\nreload = 'weight_transfer'\npush_to = ['target', 'draft']\n[variants.f]\nspeculative = false\n",
        "variants.f.push_to",
        "'draft' needs a drafter (speculative = false)",
    ),
    (
        MINIMAL.replace('method = "draft_model"', 'method = "ngram"')
        + "[cycle]\nreload = 'push'\npush_to = ['draft']\n",
        "variants.baseline.push_to",
        "needs a drafter model (ngram has none)",
    ),
    (MINIMAL + "[expect]\ngraph_safe = false\n", "expect.graph_safe", "server.enforce_eager = true"),
    (MINIMAL + "[expect]\ngraph_safe = 1\n", "expect.graph_safe", "true or false"),
    (MINIMAL + "[workload]\nmax_tokens = 1\n", "workload.max_tokens", "at least 2: the prefill makes the first"),
    (MINIMAL + "[workload]\nwarmup_tokens = 1\n", "workload.warmup_tokens", "the first bets have no step"),
    (MINIMAL + "[expect]\nbaseline = []\n", "expect.baseline", "an empty list"),
    (MINIMAL + "[expect]\nbaseline = ['collapse', 'degradd']\n", "expect.baseline", "did you mean 'degraded'?"),
    (
        MINIMAL + "[expect]\nbaseline = { '<0.34' = 'collapse', '>=0.34' = ['collapse', 'any'] }\n",
        "expect.baseline",
        "'any' is not an outcome a list may name",
    ),
]
