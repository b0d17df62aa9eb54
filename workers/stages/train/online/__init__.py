"""Training from hidden states that running vLLM capture servers produce on demand (a run's
`hidden_states: online`), instead of a whole extraction written to disk first.

The parts: `source` (what a run asks for: capture servers to start, URLs of running ones, the
cache's size), `servers` (starting and checking `vllm serve` capture servers), `capture` (asking
them for one sample, balanced across servers, retried elsewhere when one dies or stalls), `cache`
(a byte-bounded, least-recently-used folder of checked samples in the extraction's file format),
`samples` (the training dataset that reads the cache and asks the servers for the rest, fetching
ahead of the trainer) and `supply` (what the trainer waited, what the servers delivered, the
cache's hits: the run's supply figures).
"""
