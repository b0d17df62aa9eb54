"""Where our loop runs: in a process of its own (in_child), across torchrun's ranks (ddp, in_rank) and one node's
share of a training across nodes (nodes)."""
