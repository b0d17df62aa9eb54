# Projects, saved views of the runs list, and a run's project, notes and archived flag (hand-written).
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import runs.projects.models

SEARCH_INDEX = "run_search"


def earlier_runs_to_default_project(apps, schema_editor):
    """Every run made before projects goes to one open project, so that nobody loses sight of a run."""
    Project = apps.get_model("runs", "Project")
    PipelineRun = apps.get_model("runs", "PipelineRun")
    project, _ = Project.objects.get_or_create(name="Default", defaults={"open_to_all": True})
    PipelineRun.objects.filter(project__isnull=True).update(project=project)


def _search_index():
    from django.contrib.postgres.indexes import GinIndex
    from django.contrib.postgres.search import SearchVector

    # The same expression run_table's search filters by (runs.tracking.runs_list.run_search.search_vector).
    return GinIndex(SearchVector("name", "notes", config="simple"), name=SEARCH_INDEX)


def search_index_add(apps, schema_editor):
    """Full-text search over names and notes (PostgreSQL only; SQLite searches with icontains)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.add_index(apps.get_model("runs", "PipelineRun"), _search_index())


def search_index_remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.remove_index(apps.get_model("runs", "PipelineRun"), _search_index())


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0014_worker_system_metrics'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Project',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('open_to_all', models.BooleanField(default=False, help_text='every signed-in user sees its runs; those with the launcher role launch into it')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='projects_created', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='ProjectMember',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('role', models.CharField(choices=[('viewer', 'Viewer'), ('editor', 'Editor'), ('owner', 'Owner')], default='viewer', max_length=16)),
                ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='members', to='runs.project')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='project_memberships', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['project', 'user'],
                'constraints': [models.UniqueConstraint(fields=('project', 'user'), name='unique_project_member')],
            },
        ),
        migrations.AddField(
            model_name='pipelinerun',
            name='archived',
            field=models.BooleanField(default=False, help_text='hidden from the runs list unless asked for'),
        ),
        migrations.AddField(
            model_name='pipelinerun',
            name='notes',
            field=models.TextField(blank=True),
        ),
        # Null first, filled, then required: the existing runs get the Default project.
        migrations.AddField(
            model_name='pipelinerun',
            name='project',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='runs.project'),
        ),
        migrations.RunPython(earlier_runs_to_default_project, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='pipelinerun',
            name='project',
            field=models.ForeignKey(default=runs.projects.models.default_project_pk, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='runs.project'),
        ),
        migrations.RunPython(search_index_add, search_index_remove),
        migrations.CreateModel(
            name='SavedView',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100)),
                ('params', models.JSONField(default=dict)),
                ('shared', models.BooleanField(default=False)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='saved_views', to=settings.AUTH_USER_MODEL)),
                ('project', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='saved_views', to='runs.project')),
            ],
            options={
                'ordering': ['name', 'id'],
                'constraints': [models.UniqueConstraint(fields=('owner', 'name'), name='unique_saved_view_name'), models.CheckConstraint(condition=models.Q(('shared', False), ('project__isnull', False), _connector='OR'), name='shared_view_has_project')],
            },
        ),
    ]
