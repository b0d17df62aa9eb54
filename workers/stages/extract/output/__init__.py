"""What an extraction writes: one file per row (files), byte-stable headers (stable_header), the writer thread
(writer) and data_config.json with the result (result)."""
