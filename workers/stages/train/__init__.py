"""Train stage: our loop (loop: data, resume, checkpoints) or speculators' own trainer
(with_speculators/), on a train/validation split by conversation (split)."""
