"""What the web tier and the workers share, torch-free: what a user got wrong (errors), a target's
config, chat files, tensor headers, JSON files, stored dtypes, extraction layouts and their
verification, the data directory speculators trains from, what this host can run (backends, where
vLLM lives), the `vllm serve` line for a draft, acceptance arithmetic. Imports no torch,
transformers or speculators at module level, and nothing of the stages or of the Django app: the
one part of workers/ the web tier imports."""
