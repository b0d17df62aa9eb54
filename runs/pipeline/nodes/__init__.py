"""A training across nodes (a run's train_nodes > 1): who holds which rank."""
