"""The offline demo: procedural chats, a BPE tokenizer and a small trained Llama target."""
