"""Extract stage: the target's hidden states for every prepared row, with transformers
(with_transformers) or on `vllm serve` (with_vllm, vllm_server), resumable (resume), one file per row (files)."""
