"""What a training holds out for validation: the split by conversation (split) and the content key that decides
it (prompt_keys)."""
