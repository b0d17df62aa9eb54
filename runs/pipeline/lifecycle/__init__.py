"""A run's five stages in order and each stage's life as its worker records it: the row every stage and job
has, start, progress, lease and failure, the result recorded on success, what a failure asks of its user, and
the signals the pipeline sends the domains above it."""
