"""The Django-facing half of workers/: what a Celery worker runs around the stages. Thin tasks take ids
from the queue (tasks, shard_tasks, online_tasks), load rows and record results through runs/ services
(stage_runners, shard_runners, shard_stage_runners, node_runner), and keep the fleet's bookkeeping
(claims, fleet, system_metrics). The compute half (workers.stages, workers.contract, workers.vllm_plugins)
imports none of it, nor Django (tests/house/test_import_graph.py)."""
