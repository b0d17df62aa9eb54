"""Training curves (series kept in chunks, the curves API), the runs list and run comparison."""
