"""People's notes on runs: reviews and tags."""
