# Hand-written: a training's hidden-state supply figures (issue 27, runs.pipeline.models.TrainingRun.supply).
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0016_reports'),
    ]

    operations = [
        migrations.AddField(
            model_name='trainingrun',
            name='supply',
            field=models.JSONField(blank=True, default=dict, help_text=(
                "where the training's hidden states came from and how fast: offline or online, the trainer's "
                "wait for data, the capture servers' tokens/s, the cache's hit rate and peak size, supply- or "
                "compute-bound (workers.stages.train.online.SupplyReport)")),
        ),
    ]
