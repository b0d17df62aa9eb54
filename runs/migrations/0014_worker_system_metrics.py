# Placeholder, filled by the part that owns it (hand-written operations for that part's models only).
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0013_alerts'),
    ]

    operations = [
    ]
