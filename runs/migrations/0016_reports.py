# Reports (runs.reports.models), written by hand: a report and its versions.
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0015_projects_and_views'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Report',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('title', models.CharField(help_text="the newest version's title", max_length=200)),
                ('version_count', models.PositiveIntegerField(default=0, help_text="the newest version's number")),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('author', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='reports', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-updated_at', '-id'],
            },
        ),
        migrations.CreateModel(
            name='ReportVersion',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField(help_text='1 for the first save, then one more per save')),
                ('title', models.CharField(max_length=200)),
                ('body', models.TextField(blank=True, help_text='Markdown with {{chart ...}}, {{table ...}}, {{generations ...}} lines')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('report', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='versions', to='runs.report')),
                ('saved_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='report_versions', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['report', '-number'],
                'constraints': [models.UniqueConstraint(fields=('report', 'number'), name='unique_report_version')],
            },
        ),
    ]
