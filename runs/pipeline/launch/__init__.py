"""What a launch takes and checks before anything is stored: a run's settings (run_config, their bounds in
setting_bounds, one setting's checks in setting_checks, the capture servers' URLs in capture_urls), the
preflight, the chat file's first rows; and runs trained elsewhere, launched through the API."""
