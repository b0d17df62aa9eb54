"""The bell's unread count (templates/base.html), for a signed-in user.

Lazy: counted only when a template shows it, so the fragments live pages poll (rendered with the same
context processors) cost no query for it; a full page costs one, except the runs list, which counts it in its own
statement and hands the template the count, this lazy one then never read (runs.saved_views.viewer_reads)."""
from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from runs.alerts import selectors


def alerts_unread(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"alerts_unread": SimpleLazyObject(lambda: selectors.unread_count(user=user))}
