"""A vLLM server's life: start, watchdog, stop, leftovers. May import prepare/; not judge/, report/, run/'s others."""
