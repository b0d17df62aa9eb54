"""What a run's pages read of where it is: its status in one word (run_status) and its summary (run_summary),
change counters, the one-line glance, the live part of the summary, τ while training, the τ the runs list sorts by
(kept on the run's row), the upstream tools' command lines."""
