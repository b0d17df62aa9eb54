# The admin's samples list at millions of samples (issue 40; hand-written). At 2,000,000 samples it sorted every
# sample by its dataset's name on each open (0.97 s) and its search read every row twice (4.4 s). The list now sorts by
# (dataset id, line, id), which the new btree serves from its first entries; pg_trgm (migration 0033) serves the
# search's substring match (icontains: UPPER(col) LIKE UPPER('%q%')) on each searched column. The trigram indexes
# are PostgreSQL's: on SQLite (`make demo`) that step does nothing. A partial index counts a dataset's exclusions.
from django.db import migrations, models

SEARCHED = ("sample_id", "preview", "tags", "notes")  # runs.admin.DatasetSampleAdmin.search_fields


def trigram_name(column: str) -> str:
    return f"sample_{column}_trigrams"


def trigrams_add(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for column in SEARCHED:
            # The expression Django's icontains compares: the index serves exactly that filter.
            schema_editor.execute(f'CREATE INDEX "{trigram_name(column)}" ON "runs_datasetsample" '
                                  f'USING gin ((UPPER("{column}"::text)) gin_trgm_ops)')


def trigrams_remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for column in SEARCHED:
            schema_editor.execute(f'DROP INDEX IF EXISTS "{trigram_name(column)}"')


class Migration(migrations.Migration):
    dependencies = [("runs", "0037_runs_list_changes")]
    operations = [
        migrations.AlterModelOptions(name="datasetsample", options={"ordering": ["dataset_id", "line", "id"]}),
        migrations.AddIndex(model_name="datasetsample",
                            index=models.Index(fields=["dataset", "line", "id"], name="sample_dataset_line")),
        migrations.RunPython(trigrams_add, trigrams_remove),
        # A dataset's excluded samples (1% of them, say) from a partial index: counting them through the index on
        # `excluded` alone read every excluded sample's row (215 ms for one dataset of 667,000).
        migrations.AlterField(model_name="datasetsample", name="excluded", field=models.BooleanField(default=False)),
        migrations.AddIndex(model_name="datasetsample", index=models.Index(
            condition=models.Q(excluded=True), fields=["dataset"], name="sample_excluded")),
    ]
