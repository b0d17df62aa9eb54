# The runs' change counters (runs.pipeline.changes), which live pages' polls compare first.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0003_sweeps'),
    ]

    operations = [
        migrations.AddField(
            model_name='pipelinerun',
            name='changes',
            field=models.BigIntegerField(default=0, editable=False),
        ),
        migrations.AddField(
            model_name='pipelinerun',
            name='curve_changes',
            field=models.BigIntegerField(default=0, editable=False),
        ),
    ]
