"""Long work users start outside a run (catalogue, verification, regeneration, demo build, serve check): its
rows, reads and writes."""
