"""The worker's side of online runs (issue 27) that is not a stage body of its own: where an online run's
hidden states live, the OnlineSource its training gets, and "keep the cache" (a task that writes the cache
as an extraction, then registers it: runs.pipeline.online.services)."""
from __future__ import annotations

import logging
from pathlib import Path

from celery import shared_task
from django.conf import settings

from eagle3web.db import db_retry
from runs.pipeline.online import selectors as online_run
from runs.pipeline.online.services import online_keep_fail, online_keep_plan, online_keep_record

logger = logging.getLogger(__name__)


def hidden_states_dir(run) -> Path:
    """Where the run's hidden states are: its extraction's, or an online run's cache folder."""
    if online_run.is_online(run.config):
        folder = online_run.cache_dir(run.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return Path(run.extract_stage.extraction.path) / "hidden_states"


def capture_staging_dir() -> Path:
    """The one folder the files of capture servers given by URL are taken from (the setting, or a folder
    beside the runs'); their operators point the servers' shared_storage_path here (docs/online.md)."""
    return Path(settings.EAGLE3WEB_CAPTURE_STAGING_DIR or Path(settings.EAGLE3WEB_RUNS_DIR) / "capture_staging")


def online_source(run):
    """An online run's OnlineSource (workers.stages.train.online); None for an offline run."""
    if not online_run.is_online(run.config):
        return None
    from workers.contract.host.backends import backend_require, vllm_executable
    from workers.stages.train.online.source import OnlineSource

    config = run.config
    if config.get("capture_servers"):  # routed to vLLM's queue (runs.pipeline.online.selectors.train_capture_queue)
        backend_require(name="vllm", gpus=int(config.get("tensor_parallel_size") or 1))
    return OnlineSource.from_gib(cache_dir=hidden_states_dir(run), cache_gib=float(config["hidden_states_cache_gib"]),
                                 capture_servers=int(config.get("capture_servers") or 0),
                                 capture_urls=list(config.get("capture_urls") or []),
                                 vllm_executable=vllm_executable(),
                                 capture_allowed_hosts=list(settings.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS),
                                 capture_staging_dir=capture_staging_dir())


@shared_task(name="eagle3web.keep_cache", acks_late=True)
def keep_cache_task(run_id: int) -> bool:
    """Write an online run's whole cache as an extraction and register it; a refusal (rows missing) or a
    failure is recorded on the run (its supply's "kept"), never raised."""
    from workers.stages.train.online.keep import keep_cache_as_extraction

    plan = db_retry("keep plan", online_keep_plan, run_id=run_id)
    if plan is None:
        return False  # not asked for any more (kept already, or another worker took it)
    try:
        result = keep_cache_as_extraction(**plan)
    except Exception as exc:  # noqa: BLE001 - every failure must reach the run page
        logger.warning("keeping run %s's cache failed: %s", run_id, exc)
        db_retry("keep failure", online_keep_fail, run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        return False
    db_retry("keep record", online_keep_record, run_id=run_id, result=result)
    return True
