# A retried training records the step it continued from.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0014_run_tags'),
    ]

    operations = [
        migrations.AddField(
            model_name='trainingrun',
            name='resumed_from_step',
            field=models.PositiveIntegerField(blank=True, help_text='the step a retried training continued from (0: from scratch)', null=True),
        ),
    ]
