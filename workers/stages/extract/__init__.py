"""Extract stage: the target's hidden states for every prepared row, with transformers
(with_transformers: its model, batches and host copies) or on `vllm serve` (with_vllm, vllm_server),
resumable (resume), sharded (shards), one file per row (output/)."""
