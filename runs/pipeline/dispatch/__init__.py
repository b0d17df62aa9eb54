"""Handing work to the workers: the outbox and the queue by task name, routing to queues, the order runs go in
within a queue, and messages a worker took but never ran."""
