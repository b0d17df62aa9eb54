# The batch budget a shard runs its rows in (issue 36: a mixed CPU/GPU queue still gives one worker's bytes),
# and the outbox's kind for a multi-node training's rank messages.
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0031_serve_concurrency"),
    ]

    operations = [
        migrations.AddField(
            model_name="stageshard",
            name="batch_tokens",
            field=models.PositiveIntegerField(blank=True, help_text="padded tokens per forward this shard runs its rows in (the Transformers extraction's, fixed when the stage is split); empty for a stage that does not batch rows", null=True),
        ),
        migrations.AlterField(
            model_name="pendingenqueue",
            name="kind",
            field=models.CharField(choices=[("pipeline", "Pipeline"), ("evaluation", "Evaluation"), ("catalogue", "dataset catalogue"), ("verify", "extraction verification"), ("serve_check", "vLLM serve check"), ("demo_build", "demo target build"), ("shard", "stage shard"), ("train_rank", "training rank")], max_length=20),
        ),
    ]
