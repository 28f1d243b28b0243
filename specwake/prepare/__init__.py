"""Before any server starts: a scenario file read and resolved (scenario_file, scenario, and its [expect] table in
expected), builtin models built (models), models found (hub), each variant's vLLM probed (engine), patches overlaid
(overlay), the scenario checked by that vLLM (validate) with the prompts a stage sends (prompts), and each server's
exact argv and environment planned (plan); variants.py puts it together. Nothing here runs a server or a cycle:
`check`'s text, which lists the cycle's steps, is run/session/check.py.
"""
