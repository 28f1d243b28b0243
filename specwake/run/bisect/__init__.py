"""`specwake bisect` over vLLM's history. May import run/session/ (a step is a whole run); not run/server/, measure/."""
