"""Curating datasets' samples in the admin (runs/admin.py imports this): staff exclude, include again and tag
samples (runs.data.curation writes each change and its log entry); the catalogue job writes the samples. At
millions of samples every part of the list is served by an index (migration 0038): it sorts by the dataset's
id and line, searches through trigrams, and filters lengths and replies by ranges."""
from django.contrib import admin
from django.core.paginator import Paginator

from runs.admin_bases import NoAddAdmin
from runs.data.models import CurationAction, DatasetSample


class RangeFilter(admin.SimpleListFilter):
    """A column's values in named ranges: a bucket filters by the column's bounds, where listing each value
    found would read every sample on each open of the list (250 ms at 2,000,000 samples)."""
    field: str
    BUCKETS: dict[str, tuple[str, int, int | None]]  # parameter value: (label, low, high or None: no bound)

    def lookups(self, request, model_admin):
        return [(value, label) for value, (label, _, _) in self.BUCKETS.items()]

    def queryset(self, request, queryset):
        if self.value() not in self.BUCKETS:
            return queryset
        _, low, high = self.BUCKETS[self.value()]
        queryset = queryset.filter(**{f"{self.field}__gte": low})
        return queryset.filter(**{f"{self.field}__lt": high}) if high is not None else queryset


class LengthFilter(RangeFilter):
    title, parameter_name, field = "length (characters)", "length", "num_chars"
    BUCKETS = {"short": ("under 200", 0, 200), "medium": ("200 to 1,000", 200, 1000),
               "long": ("1,000 and more", 1000, None)}


class RepliesFilter(RangeFilter):
    # num_turns counts the assistant's replies; a conversation with none has nothing to train on.
    title, parameter_name, field = "assistant replies", "replies", "num_turns"
    BUCKETS = {"none": ("none", 0, 1), "one": ("one", 1, 2), "few": ("2 to 4", 2, 5), "many": ("5 and more", 5, None)}


class KeysFirstPaginator(Paginator):
    """A page reads its rows' keys first, then those rows. An OFFSET over whole rows reads and throws away every
    row before the page (0.64 s for page 10,000 of 2,000,000 samples); over the keys alone it walks the ordering's
    index (sample_dataset_line holds the id: an index-only scan where the table is vacuumed), then fetches the
    page's rows by primary key."""

    def page(self, number):
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        keys = list(self.object_list.values_list("pk", flat=True)[bottom:top])
        rows = self.object_list.order_by().in_bulk(keys)  # keeps the list's select_related; a key gone since: skipped
        return self._get_page([rows[key] for key in keys if key in rows], number, self)


@admin.register(DatasetSample)
class DatasetSampleAdmin(NoAddAdmin):
    list_display = ("sample_id", "dataset", "line", "num_turns", "num_chars", "excluded", "tags", "preview")
    list_filter = ("excluded", "dataset", LengthFilter, RepliesFilter)
    # Each searched column has a trigram index (migration 0038): a search reads the matches, not every sample.
    search_fields = ("sample_id", "preview", "tags", "notes")
    show_full_result_count = False  # a second count of every sample on each filtered open
    paginator = KeysFirstPaginator
    readonly_fields = ("dataset", "sample_id", "line", "num_turns", "num_chars", "preview", "content_hash")
    actions = ["exclude_samples", "include_samples", "tag_needs_review"]

    def get_actions(self, request):
        # Exclusion is the curation: deleting samples would lose them and their curation log (a catalogue
        # pass would add them back, uncurated). A dataset's samples go with the dataset.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @staticmethod
    def _first_ids(queryset) -> list[str]:
        """The ids the message names, read before the action (a filter such as "not excluded" would
        match none of them after it)."""
        from runs.data.curation import NAMED_SAMPLES

        return list(queryset.values_list("sample_id", flat=True)[:NAMED_SAMPLES])

    @admin.action(description="Exclude from later preparations")
    def exclude_samples(self, request, queryset):
        from runs.data.curation import samples_named, samples_set_excluded

        first = self._first_ids(queryset)
        count = samples_set_excluded(samples=queryset, excluded=True, user=request.user)
        self.message_user(request, f"Excluded {count} sample(s): {samples_named(first, total=count)}; "
                                   "runs launched from now on skip them.")

    @admin.action(description="Include again")
    def include_samples(self, request, queryset):
        from runs.data.curation import samples_named, samples_set_excluded

        first = self._first_ids(queryset)
        count = samples_set_excluded(samples=queryset, excluded=False, user=request.user)
        self.message_user(request, f"Included {count} sample(s) again: {samples_named(first, total=count)}.")

    @admin.action(description="Tag 'needs-review'")
    def tag_needs_review(self, request, queryset):
        from runs.data.curation import samples_named, samples_tag

        first = self._first_ids(queryset)
        count = samples_tag(samples=queryset, tag="needs-review", user=request.user)
        self.message_user(request, f"Tagged {count} sample(s) 'needs-review': {samples_named(first, total=count)}.")


@admin.register(CurationAction)
class CurationActionAdmin(admin.ModelAdmin):
    list_display = ("created_at", "user", "dataset", "action", "detail")
    list_select_related = ("user", "dataset")
    list_filter = ("action", "dataset", "user")
    search_fields = ("detail", "sample_ids")
    readonly_fields = ("created_at", "user", "dataset", "action", "sample_ids", "detail")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
