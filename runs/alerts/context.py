"""The bell's unread count (templates/base.html), for a signed-in user.

Lazy: counted only when a template shows it, so the fragments live pages poll (rendered with the same
context processors) cost no query for it; a full page costs one."""
from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from runs.alerts import selectors


def alerts_unread(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"alerts_unread": SimpleLazyObject(lambda: selectors.unread_count(user=user))}
