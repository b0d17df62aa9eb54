"""One training step of our loop on its device: the stepper (stepper), the draft's forward over a packed step
(packed_step) and its attention (packed_attention)."""
