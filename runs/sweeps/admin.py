"""Sweeps in the admin: staff read them and their runs; a sweep is made by launch_sweep or the launch form
(never here: one added by hand would have no runs to release), and its runs' rows by the sweep."""
from django.contrib import admin

from runs.sweeps.models import Sweep, SweepRun


class SweepRunInline(admin.TabularInline):
    model = SweepRun
    extra = 0
    can_delete = False
    readonly_fields = ("run", "position", "values", "released_at")
    fields = readonly_fields


@admin.register(Sweep)
class SweepAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "mode", "parallel", "created_at")
    search_fields = ("name",)
    inlines = [SweepRunInline]

    def has_add_permission(self, request):
        return False


@admin.register(SweepRun)
class SweepRunAdmin(admin.ModelAdmin):
    list_display = ("id", "sweep", "run", "position", "released_at")
    list_select_related = ("sweep", "run")

    # Written by the sweep's launch and release: read-only, off the index (each sweep's page lists them).
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_module_permission(self, request):
        return False
