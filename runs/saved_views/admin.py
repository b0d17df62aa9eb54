"""Saved views in the admin (runs/admin.py imports this). A saved view's parameters were checked when it
was saved (runs.saved_views.services): shown, not edited."""
from django.contrib import admin

from runs.admin_bases import NoAddAdmin
from runs.saved_views.models import SavedView


@admin.register(SavedView)
class SavedViewAdmin(NoAddAdmin):
    list_display = ("name", "owner", "project", "shared", "created_at")
    list_filter = ("shared", "project")
    list_select_related = ("owner", "project")
    search_fields = ("name", "owner__username")
    readonly_fields = ("owner", "params", "project", "shared")
