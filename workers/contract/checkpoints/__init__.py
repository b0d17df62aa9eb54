"""A trained draft on its way to serving: the folder vLLM reads (export), its README model card (model_card) and
the `vllm serve` line for it (serving)."""
