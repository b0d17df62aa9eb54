# Each worker's latest system sample on its heartbeat row (runs.fleet.models.Worker); the runs' sampled
# series need no table: they are MetricSeries under the split "system" (runs.tracking.system_series).
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0013_alerts'),
    ]

    operations = [
        migrations.AddField(
            model_name='worker',
            name='system',
            field=models.JSONField(blank=True, default=dict, help_text='its latest system sample (workers.system_metrics)'),
        ),
        migrations.AddField(
            model_name='worker',
            name='system_at',
            field=models.DateTimeField(blank=True, help_text='when that sample was taken', null=True),
        ),
    ]
