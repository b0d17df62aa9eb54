"""Reports in the admin: staff read and delete them (a report written where it must not be); a report and
its versions are written through its pages and the API (runs.reports.services), never here, so that every
save stays a version. runs/admin.py imports this module."""
from django.contrib import admin

from runs.reports.models import Report, ReportVersion


class ReportVersionInline(admin.TabularInline):
    model = ReportVersion
    extra = 0
    can_delete = False
    readonly_fields = ("number", "title", "saved_by", "created_at")
    fields = readonly_fields


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "author", "version_count", "updated_at")
    list_select_related = ("author",)
    search_fields = ("title",)
    readonly_fields = ("author", "title", "version_count", "created_at", "updated_at")
    inlines = [ReportVersionInline]

    def has_add_permission(self, request):
        return False


@admin.register(ReportVersion)
class ReportVersionAdmin(admin.ModelAdmin):
    list_display = ("id", "report", "number", "title", "saved_by", "created_at")
    list_select_related = ("report", "saved_by")

    # A version is kept as it was saved: read-only, off the index (each report's versions page lists them).
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_module_permission(self, request):
        return False
