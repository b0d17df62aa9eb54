# The best checkpoint's τ, kept on the training when runs.pipeline.best decides it, so that lists sort by it.
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0010_serve_check_prompts'),
    ]

    operations = [
        migrations.AddField(
            model_name='trainingrun',
            name='best_tau',
            field=models.FloatField(blank=True, help_text="the best checkpoint's τ (vLLM's where a serve check ran, else ours), once the run's rule decided it (runs.pipeline.best); the lists, sweeps and compare show and sort by it", null=True),
        ),
    ]
