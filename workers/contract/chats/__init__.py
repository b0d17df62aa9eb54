"""Chats: chat JSONL files (jsonl), whether a target can answer chats (template), and which prompts a measurement
of acceptance decodes (prompt_source)."""
