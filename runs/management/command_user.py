"""Who a management command acts as: --user NAME, or the 'cli' launcher account of the server's shell."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import CommandError


def command_user(username: str):
    users = get_user_model()
    if username:
        try:
            user = users.objects.get(username=username)
        except users.DoesNotExist:
            raise CommandError(f"no user named {username!r}; create one with `manage.py createsuperuser`") from None
        if not user.is_active:
            # A deactivated account cannot log in to the web; a shell must not act for it either.
            raise CommandError(f"user {username} is deactivated; an admin can reactivate it in the admin site")
        return user
    user, created = users.objects.get_or_create(username="cli")
    if created:
        # A shell on the server is trusted to launch and import; the account cannot log in to the web.
        user.set_unusable_password()
        user.save()
        user.groups.add(Group.objects.get_or_create(name="launcher")[0])
    return user
