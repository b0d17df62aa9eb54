"""eagle3web's client: `Client(url, token)` for the REST API at /api/v1/, `Eagle3WebMetricsHandler`
for speculators' `speculators.metrics` records, and the `eagle3web` command line.

Imports neither Django nor Celery (nor torch): it is installed on training clusters with
`pip install ./client`."""
from eagle3web_client.client import ApiError, Client, Datasets, Projects, Runs, WaitTimeout
from eagle3web_client.handler import Eagle3WebMetricsHandler, record_points

__all__ = ["ApiError", "Client", "Datasets", "Eagle3WebMetricsHandler", "Projects", "Runs", "WaitTimeout", "record_points"]
