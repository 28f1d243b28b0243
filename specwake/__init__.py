"""specwake: a regression tester for vLLM speculative decoding across L2 sleep/wake cycles."""

__version__ = "0.1.0"
