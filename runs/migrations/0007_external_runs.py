# Runs trained elsewhere (runs.pipeline.external): PipelineRun.external, and no target or dataset required of them.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0006_run_state_changes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='pipelinerun',
            name='external',
            field=models.BooleanField(default=False, help_text='trained elsewhere; reported through the API'),
        ),
        migrations.AlterField(
            model_name='pipelinerun',
            name='dataset',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='runs.dataset'),
        ),
        migrations.AlterField(
            model_name='pipelinerun',
            name='target',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='runs.targetmodel'),
        ),
        migrations.AddConstraint(
            model_name='pipelinerun',
            constraint=models.CheckConstraint(condition=models.Q(('external', True), models.Q(('dataset__isnull', False), ('target__isnull', False)), _connector='OR'), name='pipeline_run_has_target_and_dataset'),
        ),
    ]
