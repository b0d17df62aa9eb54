"""Make an API token for a user from the server's shell (a CI job's, a cluster's)."""
from __future__ import annotations

import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from runs.api import tokens
from runs.roles import user_roles


class Command(BaseCommand):
    help = "Make an API token for USERNAME and print it (once: only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="command line", help="what the token is for (shown on /account/)")
        parser.add_argument("--json", dest="as_json", action="store_true",
                            help="print {token, id, name, prefix, user, roles} as one JSON line")

    def handle(self, *args, **opts):
        users = get_user_model()
        try:
            user = users.objects.get(username=opts["username"])
        except users.DoesNotExist:
            raise CommandError(f"no user named {opts['username']!r}; create one with `manage.py createsuperuser` "
                               "or in the admin") from None
        try:
            token, secret = tokens.token_create(user=user, name=opts["name"])
        except tokens.TokenError as exc:
            raise CommandError(str(exc)) from None
        roles = sorted(user_roles(user))
        if opts["as_json"]:
            self.stdout.write(json.dumps({"token": secret, "id": token.pk, "name": token.name, "prefix": token.prefix,
                                          "user": user.get_username(), "roles": roles}))
            return
        self.stdout.write(secret)
        self.stderr.write(f"token {token.name!r} ({token.prefix}…) of {user.get_username()} "
                          f"(roles: {', '.join(roles) or 'none, so it can only read'}); it is not shown again")
