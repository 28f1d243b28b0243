"""Servers up, cycles run, stages measured: a whole `specwake run` (session), its scenarios (runner) scheduled on GPUs
or cores (schedule, gate, shards), one variant phase by phase (variant_run) through its server (server, client,
completions): the sleep/wake cycle (cycle), a measured stage (measure, metrics) and the workers' diagnostics
(diagnose). Records what it sees and hands each record to judge's rules (assemble): the decisions are judge's.
"""
