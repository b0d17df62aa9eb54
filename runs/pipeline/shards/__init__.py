"""A stage split over many workers (issue 36): its shards' rows, plans, claims, reads and reconcilers."""
