"""What this worker host can run: its extraction and training backends and GPUs (backends), where its vLLM lives
and how `vllm serve` is started (vllm_env), and vLLM's own check of a target and a draft, run by vLLM's Python
(vllm_preflight)."""
