"""The workers: their heartbeats, which worker fits which stage, the queue view."""
