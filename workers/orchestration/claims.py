"""A worker names itself on a queued stage's row the moment it takes the stage's message, and keeps
a mark in the broker's Redis (runs.pipeline.dispatch.message_claims says why and what the reconcilers do
with both). Imported by workers.orchestration.tasks so that every worker connects the signal."""
from __future__ import annotations

import logging

from celery.signals import task_received
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from runs.pipeline.dispatch.message_claims import broker_forgot_messages, message_claim

logger = logging.getLogger(__name__)

_broker_clients: dict[str, object] = {}


@task_received.connect
def _claim_on_receipt(sender=None, request=None, **_kwargs) -> None:
    """Runs in the worker's main process as the message arrives, before a pool process runs it. One
    quick write; a database away now only means the claim is missing, which the broker's visibility
    timeout covers (settings.EAGLE3WEB_BROKER_VISIBILITY_SECONDS): never stall the consumer for it."""
    if request is None:
        return
    try:
        close_old_connections()
        message_claim(task_name=request.name, args=request.args or (), worker=request.hostname or "")
    except DatabaseError:
        logger.warning("could not record that this worker took %s%s", request.name, tuple(request.args or ()),
                       exc_info=True)


def broker_mark_check() -> list[str]:
    """For a Redis broker: send again what a broker that came back empty forgot (see
    runs.pipeline.dispatch.message_claims.broker_forgot_messages). Other brokers keep their messages on disk."""
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        return []
    import redis

    client = _broker_clients.get(url)
    if client is None:
        client = _broker_clients[url] = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    return broker_forgot_messages(client)
