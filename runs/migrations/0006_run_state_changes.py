# The runs' third change counter (runs.pipeline.changes): writes to what the runs list shows.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0005_api_tokens'),
    ]

    operations = [
        migrations.AddField(
            model_name='pipelinerun',
            name='state_changes',
            field=models.BigIntegerField(default=0, editable=False),
        ),
    ]
