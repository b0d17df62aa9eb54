"""A stage's long-running child processes (vLLM's server, torchrun): what each needs (child_process), and the
group leader that takes them down with the worker (child_guard)."""
