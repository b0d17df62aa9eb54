"""The draft being trained: its config.json, written without torch before training (config), and the model and
optimizer built as speculators builds them (model)."""
