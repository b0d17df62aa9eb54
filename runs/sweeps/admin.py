"""Sweeps in the admin: staff read them and their runs; a sweep is made by launch_sweep or the launch form."""
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


@admin.register(SweepRun)
class SweepRunAdmin(admin.ModelAdmin):
    list_display = ("id", "sweep", "run", "position", "released_at")
    list_select_related = ("sweep", "run")
