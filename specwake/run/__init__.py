"""Servers up, cycles run, stages measured, in four parts, each a folder whose ruff.toml bans what it may not import:
server/ a vLLM server's life (server, lifeline, leftovers, groups, raycluster); measure/ the measuring of a running
server (client, completions, cycle, measure, metrics, diagnose, gate); session/ what drives them: a whole `specwake
run` (session), `check`, its scenarios (runner) scheduled on GPUs or cores (schedule, shards), one variant phase by
phase (variant_run), each record handed to judge's rules (assemble); bisect/ `specwake bisect`, a session per step
(bisect, vllm_git, bisect_cache). Records what it sees: the decisions are judge's.
"""
