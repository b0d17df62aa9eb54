"""A pipeline run: its settings, its five stages in order, their rows and attempts, the queue
and its routing, what workers record while a stage runs, and the jobs users start outside a run."""
