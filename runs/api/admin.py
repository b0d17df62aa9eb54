"""Tokens, the API's audit trail and launches' Idempotency-Keys in the admin (runs/admin.py imports
this). Staff see every token and revoke them; nobody sees a secret (only its hash is stored, and the
hash is not shown either) or makes one here: a token is made on /account/ or by manage.py
create_api_token, where its secret can be shown once."""
from django.contrib import admin

from runs.api.models import AccountSettings, ApiAuditEntry, ApiToken, LaunchIdempotencyKey
from runs.api.tokens import tokens_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "user")
    search_fields = ("name", "prefix", "user__username")
    fields = readonly_fields = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        count = tokens_revoke(tokens=queryset)
        self.message_user(request, f"Revoked {count} token(s); requests with them are refused from now on.")


@admin.register(ApiAuditEntry)
class ApiAuditEntryAdmin(admin.ModelAdmin):
    list_display = ("created_at", "user", "token_prefix", "method", "path", "status", "client")
    list_filter = ("method", "status", "user")
    search_fields = ("path", "token_prefix", "user__username")
    fields = readonly_fields = ("created_at", "user", "token", "token_prefix", "method", "path", "status", "client")
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AccountSettings)
class AccountSettingsAdmin(admin.ModelAdmin):
    list_display = ("user", "team_may_act")
    list_filter = ("team_may_act",)
    search_fields = ("user__username",)


@admin.register(LaunchIdempotencyKey)
class LaunchIdempotencyKeyAdmin(admin.ModelAdmin):
    """Read-only: a key is written by the launch it guards (runs.api.bodies.idempotency). Deleting one forgets it,
    so that the same key launches anew."""

    list_display = ("created_at", "user", "key", "run")
    list_filter = ("user",)
    search_fields = ("key", "user__username")
    fields = readonly_fields = ("created_at", "user", "key", "body_sha256", "run")
    date_hierarchy = "created_at"
    list_select_related = ("user", "run")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
