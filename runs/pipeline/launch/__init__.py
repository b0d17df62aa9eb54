"""What a launch takes and checks before anything is stored: a run's settings (run_config), the preflight, the
chat file's first rows; and runs trained elsewhere, launched through the API."""
