# Tags on runs, for the runs list's filter.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0013_metric_series'),
    ]

    operations = [
        migrations.CreateModel(
            name='RunTag',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=40, unique=True)),
                ('runs', models.ManyToManyField(blank=True, related_name='tags', to='runs.pipelinerun')),
            ],
            options={
                'ordering': ['name'],
            },
        ),
    ]
