"""/account/: a user's API tokens, who may act on their runs, what their tokens did lately."""
