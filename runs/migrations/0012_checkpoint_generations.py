# Hand-written: the generations table of the checkpoint page (runs.checkpoints.models.CheckpointGenerations).
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0011_training_best_tau'),
    ]

    operations = [
        migrations.CreateModel(
            name='CheckpointGenerations',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('num_speculative_tokens', models.PositiveIntegerField()),
                ('tokens_cap', models.PositiveIntegerField(help_text='reply tokens kept per prompt')),
                ('prompts_cap', models.PositiveIntegerField(help_text='prompts kept per measurement')),
                ('prompts', models.JSONField(blank=True, default=list)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('checkpoint', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='generations',
                                                 to='runs.checkpoint')),
                ('evaluation', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE,
                                                    related_name='generations', to='runs.evaluation')),
            ],
            options={
                'ordering': ['-id'],
            },
        ),
    ]
