# Curves move from a row per point to chunked series (runs/tracking/models.py); no point is lost.

import django.db.models.deletion
from django.db import migrations, models


def points_to_series(apps, schema_editor):
    """Every stored point moves into its series' chunks, with the series' summary."""
    from runs.tracking.chunks import CHUNK_POINTS, Points, pack, pack_one, preview

    import numpy as np

    MetricPoint = apps.get_model("runs", "MetricPoint")
    MetricSeries = apps.get_model("runs", "MetricSeries")
    MetricChunk = apps.get_model("runs", "MetricChunk")
    groups = MetricPoint.objects.values_list("training_run_id", "split", "key").distinct()
    for training_run_id, split, key in groups:
        rows = list(MetricPoint.objects.filter(training_run_id=training_run_id, split=split, key=key)
                    .order_by("step", "-id").values_list("step", "epoch", "value", "id"))
        seen, kept = set(), []
        for step, epoch, value, _ in rows:  # of two points at one step, the later one (higher id) stays
            if step not in seen:
                seen.add(step)
                kept.append((step, epoch, value))
        points = Points(steps=np.array([r[0] for r in kept], dtype=np.int64),
                        epochs=np.array([r[1] for r in kept], dtype=np.float64),
                        values=np.array([r[2] for r in kept], dtype=np.float64),
                        times=np.zeros(len(kept), dtype=np.float64))  # points carried no time before
        finite = np.isfinite(points.values)
        values = np.where(finite, points.values, np.nan)
        lo = int(np.nanargmin(values)) if finite.any() else None
        hi = int(np.nanargmax(values)) if finite.any() else None
        series = MetricSeries.objects.create(
            training_run_id=training_run_id, split=split, key=key, num_points=len(points),
            first_step=int(points.steps[0]), last_step=int(points.steps[-1]), last_value=float(points.values[-1]),
            last_epoch=float(points.epochs[-1]), num_non_finite=int((~finite).sum()), num_refused=len(rows) - len(kept),
            min_value=None if lo is None else float(values[lo]), min_step=None if lo is None else int(points.steps[lo]),
            max_value=None if hi is None else float(values[hi]), max_step=None if hi is None else int(points.steps[hi]),
            open_points=len(points) % CHUNK_POINTS, open_chunks=int(len(points) % CHUNK_POINTS > 0))
        for start in range(0, len(points), CHUNK_POINTS):
            part = points.take(slice(start, start + CHUNK_POINTS))
            MetricChunk.objects.create(series=series, first_step=int(part.steps[0]), last_step=int(part.steps[-1]),
                                       num_points=len(part), **pack(part),
                                       preview=pack_one(preview(part)) if len(part) == CHUNK_POINTS else b"")


def chunks_uncompressed(apps, schema_editor):
    """Packed floats do not compress: PostgreSQL's default TOAST compression only made every chunk
    write slower. Stored out of line, uncompressed."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for column in ("steps", "epochs", "values", "times", "preview"):
        schema_editor.execute(f'ALTER TABLE runs_metricchunk ALTER COLUMN "{column}" SET STORAGE EXTERNAL')


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0012_extract_stage_and_artifact_provenance'),
    ]

    operations = [
        migrations.CreateModel(
            name='MetricSeries',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('split', models.CharField(max_length=10)),
                ('key', models.CharField(max_length=50)),
                ('num_points', models.BigIntegerField(default=0)),
                ('first_step', models.BigIntegerField(blank=True, null=True)),
                ('last_step', models.BigIntegerField(blank=True, null=True)),
                ('last_value', models.FloatField(blank=True, null=True)),
                ('last_epoch', models.FloatField(blank=True, null=True)),
                ('min_value', models.FloatField(blank=True, null=True)),
                ('min_step', models.BigIntegerField(blank=True, null=True)),
                ('max_value', models.FloatField(blank=True, null=True)),
                ('max_step', models.BigIntegerField(blank=True, null=True)),
                ('num_non_finite', models.BigIntegerField(default=0, help_text='NaN or infinite values: kept, not drawn')),
                ('num_refused', models.BigIntegerField(default=0, help_text='points refused: their step was not after the last one')),
                ('open_points', models.PositiveIntegerField(default=0)),
                ('open_chunks', models.PositiveIntegerField(default=0)),
                ('training_run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='metric_series', to='runs.trainingrun')),
            ],
            options={
                'verbose_name_plural': 'metric series',
                'ordering': ['training_run', 'key', 'split'],
            },
        ),
        migrations.CreateModel(
            name='MetricChunk',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('first_step', models.BigIntegerField()),
                ('last_step', models.BigIntegerField()),
                ('num_points', models.PositiveIntegerField()),
                ('steps', models.BinaryField()),
                ('epochs', models.BinaryField()),
                ('values', models.BinaryField()),
                ('times', models.BinaryField()),
                ('preview', models.BinaryField()),
                ('series', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='chunks', to='runs.metricseries')),
            ],
            options={
                'ordering': ['series', 'first_step'],
            },
        ),
        migrations.AddConstraint(
            model_name='metricseries',
            constraint=models.UniqueConstraint(fields=('training_run', 'split', 'key'), name='unique_metric_series'),
        ),
        migrations.AddIndex(
            model_name='metricchunk',
            index=models.Index(fields=['series', 'last_step'], name='metric_chunk_series_last'),
        ),
        migrations.RunPython(chunks_uncompressed, migrations.RunPython.noop),
        migrations.RunPython(points_to_series, migrations.RunPython.noop),
        migrations.DeleteModel(
            name='MetricPoint',
        ),
    ]
