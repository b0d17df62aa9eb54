"""What a training saves as it goes: the epoch checkpoint folders in speculators' layout (epochs) and the state a
retried attempt resumes from (resume)."""
