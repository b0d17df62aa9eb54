"""Online hidden states (a run's `hidden_states: online`) as the web tier sees them, and "keep the cache"."""
