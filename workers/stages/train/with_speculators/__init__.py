"""The speculators training backend: speculators 0.9's Trainer under torchrun (trainer), its entry
point (entry), what it will do with a run's rows (plan), its metric records as our points and
checkpoints (records), and its finished epochs (ledger); it reads the rows in our split's order
(split_data), beside the run's links folder (workers.contract.extraction.speculators_layout, whose command the
pages print), or, online, asks a vLLM capture server for them through its own endpoint option (online)."""
