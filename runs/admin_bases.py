"""The admin's two kinds of restricted model page, shared by runs/admin.py and the parts' admin modules
(runs/alerts/admin.py, runs/projects/admin.py) without those importing runs.admin back."""
from django.contrib import admin


# The index lists what staff curate (targets, datasets and their samples, runs, checkpoints, reviews,
# tags, tokens, workers, users). Only what a person makes by hand without breaking an invariant has
# "Add": the rest is written by a launch, an import, a registration, a heartbeat or a worker.
class NoAddAdmin(admin.ModelAdmin):
    """Rows a service writes (checked there: a target read from its config.json, a run launched with its
    stages, an import that read its files): staff read, edit what the page allows and delete; no Add."""

    def has_add_permission(self, request, obj=None):
        return False


class InternalAdmin(NoAddAdmin):
    """Bookkeeping only workers and services write (stage records, attempts, jobs, metric chunks...): off
    the index and read-only. Its pages stay open by URL (and from the run's page), deleting included,
    for recovery."""

    def has_change_permission(self, request, obj=None):
        return False

    def has_module_permission(self, request):
        return False
