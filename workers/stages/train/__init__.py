"""Train stage: our loop (loop, with its data, its step on the device in step/, the draft in draft/, what it
saves in checkpoints/, and the processes it runs in, across nodes too, in processes/) or speculators' own
trainer (with_speculators/), on a train/validation split by conversation (holdout/); what either hands back
(results), and hidden states captured as training goes (online/)."""
