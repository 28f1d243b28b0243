"""Code that runs inside a vLLM server's interpreter, with torch: the worker extension that vLLM mixes into
its workers, and the generators of the builtin checkpoints. The CLI process never imports this package.
"""
