"""Drafts once trained: importing ones trained elsewhere, measuring their acceptance length, and
asking vLLM to serve them (serve checks)."""
