"""The speculators training backend: speculators 0.9's Trainer under torchrun (trainer), its entry
point (entry), what it will do with a run's rows (plan), and its finished epochs (ledger);
the data directory it reads is workers.contract.speculators_layout (pages print its command)."""
