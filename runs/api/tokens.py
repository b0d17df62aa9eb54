"""API tokens: made, found, revoked; failed attempts counted per client; every request recorded.

A token is 32 random bytes (256 bits) in URL-safe base64 behind "e3w_". Only its SHA-256 is stored.
A slow hash (bcrypt, PBKDF2) protects secrets people choose, which are few enough to guess; nobody
can enumerate 2^256 secrets, so a fast hash loses nothing, lets the secret be looked up by an index,
and costs a request microseconds instead of the ~100 ms a slow hash spends on purpose."""
from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
import unicodedata
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from redis.exceptions import RedisError

from runs.api.models import TOKEN_PREFIX_CHARS, AccountSettings, ApiAuditEntry, ApiToken
from workers.contract.errors import InputError

log = logging.getLogger(__name__)

SCHEME = "e3w_"
MAX_NAME_CHARS = 100
MAX_TOKENS_PER_USER = 50  # active ones: a script that makes a token per run fills this, and is told
LAST_USED_RESOLUTION = timedelta(seconds=60)  # a token polled every second writes its row once a minute


class TokenError(InputError):
    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_token_name(name: object) -> str:
    if not isinstance(name, str):
        raise TokenError(f"name must be text, got {type(name).__name__}", field="name")
    name = " ".join(name.split())
    if not name:
        raise TokenError("name the token after where it is used (e.g. 'slurm cluster', 'ci')", field="name")
    if len(name) > MAX_NAME_CHARS:
        raise TokenError(f"name is {len(name)} characters long; at most {MAX_NAME_CHARS}", field="name")
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        raise TokenError("name may not hold control characters", field="name")
    return name


@transaction.atomic
def token_create(*, user: AbstractBaseUser, name: str) -> tuple[ApiToken, str]:
    """A new token of `user` and its secret, which is not stored anywhere: give it to the user now."""
    name = check_token_name(name)
    if not user.is_active:
        raise TokenError(f"user {user.get_username()} is deactivated; an admin can reactivate it first")
    active = ApiToken.objects.filter(user=user, revoked_at__isnull=True).count()
    if active >= MAX_TOKENS_PER_USER:
        raise TokenError(f"{user.get_username()} has {active} active tokens, the most allowed; revoke unused ones")
    secret = SCHEME + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, prefix=secret[:TOKEN_PREFIX_CHARS],
                                    secret_hash=secret_hash(secret))
    return token, secret


def token_revoke(*, user: AbstractBaseUser, token_id: int) -> ApiToken:
    """Revoke one of the user's own tokens (staff revoke anyone's in the admin); revoking twice keeps
    the first time."""
    token = ApiToken.objects.filter(pk=token_id, user=user).first()
    if token is None:
        raise TokenError(f"you have no token {token_id}", field="token")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def tokens_revoke(*, tokens: QuerySet[ApiToken]) -> int:
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


def user_tokens(*, user: AbstractBaseUser) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("revoked_at", "-created_at", "-id")


class TokenRefused(Exception):
    """Why a presented secret does not authenticate; said to the client as a 401."""


def token_authenticate(*, secret: str) -> ApiToken:
    """The active token with this secret (its user loaded), its last use noted; TokenRefused otherwise."""
    token = ApiToken.objects.select_related("user").filter(secret_hash=secret_hash(secret)).first()
    # The lookup is by hash, so no comparison of the secret leaks timing; this one guards the index.
    if token is None or not hmac.compare_digest(token.secret_hash, secret_hash(secret)):
        raise TokenRefused("the token is not known: check it was copied whole, or create one on /account/")
    if token.revoked_at is not None:
        raise TokenRefused(f"token {token.prefix}… ({token.name}) was revoked at {token.revoked_at:%Y-%m-%d %H:%M} "
                           "UTC; create a new one on /account/")
    if not token.user.is_active:
        raise TokenRefused(f"user {token.user.get_username()} is deactivated")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


# Failed authentication, counted per client address in fixed one-minute windows in Django's cache
# "auth_failures" (Redis when there is one: shared by every web process; eagle3web/settings.py). A client
# over the limit is refused before its token is even looked at, good token or not, until the window ends:
# otherwise a guesser would still learn which guess is right.
#
# Redis away must not take authentication with it: while the shared cache cannot be reached the counts
# go to this process's memory (each web process then counts alone, so a guesser gets a few times the
# limit instead of none), with one warning a minute, and Redis is tried again after RETRY_CACHE_SECONDS.
CACHE_ERRORS = (RedisError, OSError)  # redis-py's own, and a socket error that escapes it
RETRY_CACHE_SECONDS = 5.0
WARN_EVERY_SECONDS = 60.0
_local_failures = LocMemCache("api-auth-failures-fallback", {"TIMEOUT": 120, "OPTIONS": {"MAX_ENTRIES": 10_000}})
_cache_state = {"down_until": 0.0, "warned_at": -WARN_EVERY_SECONDS}


def _failures_key(client: str, window: int) -> str:
    return f"api-auth-failures:{client}:{window}"


def _failures_cache():
    # Its own cache where settings name one (Redis, shared by the web processes), else the default one.
    return caches["auth_failures" if "auth_failures" in settings.CACHES else "default"]


def _counted(op):
    """op(cache) on the shared cache, or on this process's memory while the shared one is unreachable."""
    now = time.monotonic()
    if now >= _cache_state["down_until"]:
        try:
            return op(_failures_cache())
        except CACHE_ERRORS as exc:
            _cache_state["down_until"] = now + RETRY_CACHE_SECONDS
            if now - _cache_state["warned_at"] >= WARN_EVERY_SECONDS:
                _cache_state["warned_at"] = now
                log.warning("the auth-failures cache is unreachable (%s): failed API authentications are counted "
                            "in this process's memory until it answers (this warning at most once a minute)", exc)
    return op(_local_failures)


def auth_failure_limit() -> int:
    return int(getattr(settings, "EAGLE3WEB_API_AUTH_FAILURES_PER_MINUTE", 20))


def auth_blocked_for(*, client: str) -> int:
    """Seconds until `client` may try again; 0 when it may now."""
    now = time.time()
    window = int(now // 60)
    if (_counted(lambda cache: cache.get(_failures_key(client, window))) or 0) >= auth_failure_limit():
        return max(1, int((window + 1) * 60 - now) + 1)
    return 0


def _incr(cache, key: str) -> int:
    cache.add(key, 0, timeout=120)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=120)
        return 1


def auth_failure_record(*, client: str) -> int:
    """Count one failed attempt of `client`; how many it made in this window."""
    key = _failures_key(client, int(time.time() // 60))
    return _counted(lambda cache: _incr(cache, key))


def auth_failures_clear(*, client: str) -> None:
    """Forget the client's failed attempts, in the shared cache and this process's (an admin letting a
    blocked address in again; tests)."""
    window = int(time.time() // 60)
    keys = [_failures_key(client, w) for w in (window - 1, window)]
    _local_failures.delete_many(keys)
    _counted(lambda cache: cache.delete_many(keys))


# A secret where it does not belong (a query string, say) is cut to its prefix before it is written anywhere.
SECRET_RE = re.compile(re.escape(SCHEME) + r"[A-Za-z0-9_\-]+")


def secrets_redacted(text: str) -> str:
    return SECRET_RE.sub(lambda m: m[0][:TOKEN_PREFIX_CHARS] + "…", text)


def audit_record(*, user: AbstractBaseUser, token: ApiToken | None, method: str, path: str, status: int,
                 client: str) -> ApiAuditEntry:
    return ApiAuditEntry.objects.create(user=user, token=token, token_prefix=token.prefix if token else "",
                                        method=method[:10], path=secrets_redacted(path)[:500], status=status,
                                        client=client[:45])


def user_audit(*, user: AbstractBaseUser, limit: int = 50) -> list[ApiAuditEntry]:
    return list(ApiAuditEntry.objects.filter(user=user).order_by("-created_at", "-id")[:limit])


def account_settings(*, user: AbstractBaseUser) -> AccountSettings:
    """The user's settings, defaults when never saved (nothing is written by reading)."""
    return AccountSettings.objects.filter(user=user).first() or AccountSettings(user=user)


def account_team_set(*, user: AbstractBaseUser, team_may_act: bool) -> AccountSettings:
    row, _ = AccountSettings.objects.update_or_create(user=user, defaults={"team_may_act": bool(team_may_act)})
    return row
