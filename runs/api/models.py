"""Personal API tokens, the audit trail of what the API was asked, a user's account settings, and the
Idempotency-Keys of launches (a retried launch answers the run the first one made).

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX_CHARS = 12  # "e3w_" and 8 characters of the secret: enough to tell a user's tokens apart


class ApiToken(models.Model):
    """A secret a script sends as `Authorization: Bearer <secret>`; it acts as its user, with the user's
    role. Only the secret's SHA-256 is stored: it is shown once, when made (runs.api.tokens)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=TOKEN_PREFIX_CHARS)
    secret_hash = models.CharField(max_length=64, unique=True)  # hex SHA-256 of the whole secret
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) of {self.user}"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class ApiAuditEntry(models.Model):
    """One request of the API: every request a token made, and every write a browser session made.
    Nobody edits these rows, not even staff (runs/api/admin.py)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="api_audit")
    # Kept when the token is deleted: the entry still says which one it was by its prefix.
    token = models.ForeignKey(ApiToken, on_delete=models.SET_NULL, null=True, blank=True, related_name="audit")
    token_prefix = models.CharField(max_length=TOKEN_PREFIX_CHARS, blank=True)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=500)
    status = models.PositiveSmallIntegerField()
    client = models.CharField(max_length=45, blank=True)  # REMOTE_ADDR
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API audit entry"
        verbose_name_plural = "API audit entries"

    def __str__(self) -> str:
        return f"{self.user} {self.method} {self.path} -> {self.status}"


class AccountSettings(models.Model):
    """What a user decides for themselves. `team_may_act`: the members of their teams (their groups
    other than the roles) may cancel, retry and tag their runs, as they may themselves
    (runs.roles.require_on_run); off until they turn it on."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="account_settings")
    team_may_act = models.BooleanField(default=False, help_text="My teams may cancel, retry and tag my runs.")

    class Meta:
        verbose_name = "account settings"
        verbose_name_plural = "account settings"

    def __str__(self) -> str:
        return f"settings of {self.user}"


IDEMPOTENCY_KEY_MAX_CHARS = 200


class LaunchIdempotencyKey(models.Model):
    """An `Idempotency-Key` a user sent with POST /api/v1/runs/: the same key and body again within a day
    answers this run instead of launching another (runs.api.bodies.idempotency). One row per user and key: the
    unique constraint is what lets only one of two concurrent requests with the key make a run."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="launch_keys")
    key = models.CharField(max_length=IDEMPOTENCY_KEY_MAX_CHARS)
    body_sha256 = models.CharField(max_length=64)  # hex SHA-256 of the body, canonical JSON: same key, other body = 409
    # Null only inside the transaction that claimed the key and is launching its run (it commits both or
    # neither). A deleted run takes its key along: a retry then launches anew rather than answering a 404.
    run = models.ForeignKey("runs.PipelineRun", on_delete=models.CASCADE, null=True, blank=True,
                            related_name="launch_keys")
    # Not auto_now_add: a row past its day is reused for the key's new run, with a new time.
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "launch idempotency key"
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="launch_key_unique_per_user")]

    def __str__(self) -> str:
        return f"{self.key[:40]} of {self.user} -> run {self.run_id}"
