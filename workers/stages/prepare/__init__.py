"""Prepare stage: a chat file rendered into speculators' prepared dataset (stage), a conversation into rows and
loss masks (render), and a sharded preparation's merge (merge)."""
