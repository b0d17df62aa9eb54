from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0017_workers'),
    ]

    operations = [
        migrations.AddField(
            model_name='datasetsample',
            name='content_hash',
            field=models.CharField(blank=True, db_index=True, max_length=64),
        ),
    ]
