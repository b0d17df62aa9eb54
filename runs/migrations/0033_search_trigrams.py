# The runs list's search and setting filters at 100,000 runs (issue 40; hand-written).
# pg_trgm serves the search box's substring match on run names (icontains: UPPER(name) LIKE UPPER('%q%')),
# which no index served before; a GIN index on config serves the setting filters (config @> {...}); the
# visibility index gains the run id so search's count reads the projects' run ids from the index alone.
# The extension and both GIN indexes are PostgreSQL's: on SQLite (`make demo`) these steps do nothing.
from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations, models

NAME_TRIGRAMS = "run_name_trigrams"
CONFIG_GIN = "run_config_gin"


def gin_indexes_add(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # The expression Django's icontains compares (runs.tracking.runs_list.run_search.searched): the index serves
        # exactly that filter and no other spelling of it.
        schema_editor.execute(f'CREATE INDEX "{NAME_TRIGRAMS}" ON "runs_pipelinerun" '
                              'USING gin ((UPPER("name"::text)) gin_trgm_ops)')
        schema_editor.execute(f'CREATE INDEX "{CONFIG_GIN}" ON "runs_pipelinerun" USING gin ("config" jsonb_path_ops)')


def gin_indexes_remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX IF EXISTS "{NAME_TRIGRAMS}"')
        schema_editor.execute(f'DROP INDEX IF EXISTS "{CONFIG_GIN}"')


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0030_regeneration_shards'),
    ]

    operations = [
        TrigramExtension(),  # CREATE EXTENSION IF NOT EXISTS pg_trgm; nothing on SQLite
        migrations.RunPython(gin_indexes_add, gin_indexes_remove),
        migrations.RemoveIndex(model_name='pipelinerun', name='run_project_archived'),
        migrations.AddIndex(
            model_name='pipelinerun',
            index=models.Index(fields=['project', 'archived', 'id'], name='run_project_archived_id'),
        ),
    ]
