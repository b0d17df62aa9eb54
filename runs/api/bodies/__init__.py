"""What the API reads: JSON bodies with limits, their shapes (serializers), a launch's body through the launch
form, and Idempotency-Key."""
