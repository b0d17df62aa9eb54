from pathlib import Path

from django.db import migrations, models


def fill_speculative_tokens(apps, schema_editor):
    """Existing checkpoints: the count their config.json says, where it is still readable."""
    from runs.pipeline.status.upstream_commands import recorded_speculative_tokens

    Checkpoint = apps.get_model("runs", "Checkpoint")
    for checkpoint in Checkpoint.objects.filter(speculative_tokens__isnull=True).only("pk", "path").iterator():
        tokens = recorded_speculative_tokens(Path(checkpoint.path))
        if tokens is not None:  # moved or unreadable: stays empty, the serve command reads it when shown
            Checkpoint.objects.filter(pk=checkpoint.pk).update(speculative_tokens=tokens)


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0018_datasetsample_content_hash'),
    ]

    operations = [
        migrations.AddField(
            model_name='checkpoint',
            name='speculative_tokens',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(fill_speculative_tokens, migrations.RunPython.noop),
    ]
