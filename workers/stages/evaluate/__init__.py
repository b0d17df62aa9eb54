"""Evaluate stage: a draft's acceptance length by real speculative decoding (measure, speculative,
prompts), and the serve check, where vLLM itself serves the draft (serve_check)."""
