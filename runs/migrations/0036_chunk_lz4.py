# A curve chunk's columns are compressed with lz4 instead of PostgreSQL's default pglz (issue 40; hand-written).
# Every batch of points inserts a chunk of four arrays of 8 kB or more, which PostgreSQL compresses on the way
# to its TOAST table: pglz took 2.7-3.1 ms per 1,000-point chunk on this machine (most of a batch's write),
# lz4 0.3 ms, for the same stored size (24.8 against 24.9 kB). Chunks stored before keep their pglz; both read
# alike. PostgreSQL only (14 and later, built with lz4 as Debian's and the postgres image's are); on SQLite, or
# a server built without lz4, nothing changes.
from django.db import migrations

COLUMNS = ("steps", "epochs", "values", "times", "preview")


def _compression_set(schema_editor, method: str) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'", [method])
        row = cursor.fetchone()
    if not row or not row[0]:
        return
    changes = ", ".join(f'ALTER COLUMN "{column}" SET COMPRESSION {method}' for column in COLUMNS)
    schema_editor.execute(f'ALTER TABLE "runs_metricchunk" {changes}')


def lz4_set(apps, schema_editor):
    _compression_set(schema_editor, "lz4")


def pglz_set(apps, schema_editor):
    _compression_set(schema_editor, "pglz")


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0032_shard_batch_tokens'),
    ]

    operations = [
        migrations.RunPython(lz4_set, pglz_set),
    ]
