# Alerts (runs.alerts.models): rules, firings, the bell's notices, deliveries, and the stalled-stage watch.
# Written by hand, for this part's models only.
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0012_checkpoint_generations'),
        ('auth', '0012_alter_user_first_name_max_length'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='AlertRule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event', models.CharField(choices=[('run_failed', 'a run failed'), ('stage_stalled', 'a stage made no progress for N minutes'), ('tau_below', "τ below a threshold or a baseline run's"), ('loss_nan', 'a loss became NaN or infinite'), ('worker_lost', "a stage's worker was lost")], max_length=20)),
                ('staff', models.BooleanField(default=False, help_text='the team is every staff user')),
                ('email', models.BooleanField(default=False, help_text='mail each recipient that has an address')),
                ('webhook_url', models.URLField(blank=True, help_text='Slack-compatible: POST {"text": ...}', max_length=1000)),
                ('threshold', models.FloatField(blank=True, help_text='tau_below: fire when τ is below this', null=True)),
                ('stall_minutes', models.PositiveIntegerField(blank=True, help_text='stage_stalled: minutes without progress', null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('baseline_run', models.ForeignKey(blank=True, help_text="tau_below: fire when τ is below this run's", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='runs.pipelinerun')),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alert_rules', to=settings.AUTH_USER_MODEL)),
                ('team', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='alert_rules', to='auth.group')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
            },
        ),
        migrations.CreateModel(
            name='Alert',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('subject', models.CharField(max_length=200)),
                ('event', models.CharField(choices=[('run_failed', 'a run failed'), ('stage_stalled', 'a stage made no progress for N minutes'), ('tau_below', "τ below a threshold or a baseline run's"), ('loss_nan', 'a loss became NaN or infinite'), ('worker_lost', "a stage's worker was lost")], max_length=20)),
                ('text', models.TextField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='runs.pipelinerun')),
                ('rule', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='runs.alertrule')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
                'constraints': [models.UniqueConstraint(fields=('rule', 'subject'), name='alert_once_per_rule_subject')],
            },
        ),
        migrations.CreateModel(
            name='AlertDelivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('channel', models.CharField(choices=[('email', 'email'), ('webhook', 'webhook')], max_length=10)),
                ('destination', models.CharField(max_length=1000)),
                ('status', models.CharField(choices=[('pending', 'pending'), ('sent', 'sent'), ('failed', 'failed (gave up)'), ('refused', 'refused (not an allowed destination)')], db_index=True, default='pending', max_length=10)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_error', models.TextField(blank=True)),
                ('next_attempt_at', models.DateTimeField(blank=True, help_text='pending: not tried again before this', null=True)),
                ('handed_at', models.DateTimeField(blank=True, help_text='when its message was due to run: a pending delivery long past it lost its message and is sent again', null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('alert', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='runs.alert')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
            },
        ),
        migrations.CreateModel(
            name='StageWatch',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('stage', models.CharField(max_length=20)),
                ('record_id', models.BigIntegerField()),
                ('started_at', models.DateTimeField(help_text='which attempt of the stage')),
                ('progress_done', models.BigIntegerField(default=0)),
                ('unchanged_since', models.DateTimeField()),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('stage', 'record_id'), name='stage_watch_once')],
            },
        ),
        migrations.CreateModel(
            name='AlertNotice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('read_at', models.DateTimeField(blank=True, null=True)),
                ('alert', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notices', to='runs.alert')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alert_notices', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-alert__created_at', '-id'],
                'indexes': [models.Index(fields=['user', 'read_at'], name='alert_notice_unread')],
                'constraints': [models.UniqueConstraint(fields=('alert', 'user'), name='alert_notice_once_per_user')],
            },
        ),
    ]
