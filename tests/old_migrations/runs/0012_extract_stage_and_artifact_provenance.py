"""Executions apart from artifacts.

The extract stage of a run becomes its own row (ExtractStage); Extraction keeps only the hidden
states on disk and says where they came from: `produced_by` a run's stage, or imported (`imported_at`,
`imported_by`, `imported_from`). Checkpoint's `imported` flag becomes the same provenance.

Existing rows: a run's extraction row becomes an ExtractStage with the same id (so its attempts,
keyed by stage id, stay linked) and, when it wrote files or was verified or reviewed, an Extraction
with the same id too (so /extractions/<id>/ still answers). An imported row becomes an artifact only.
"""
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.core.management.color import no_style
from django.db import migrations, models
from django.db.models import F
from django.db.models.functions import Coalesce

STAGE_FIELDS = ("status", "queued_at", "started_at", "finished_at", "progress_done", "progress_total", "worker",
                "error", "log_tail", "lease_expires_at")
MEASURED = ("device", "model_load_seconds", "forward_seconds", "tokens_per_second")


def _check_deferred(connection) -> None:
    """Rows were written with deferred foreign keys: check them now, so that the ALTER TABLEs that
    follow in this transaction do not meet pending trigger events (PostgreSQL refuses those)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def _reset_sequences(connection, *models_) -> None:
    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(no_style(), list(models_)):
            cursor.execute(sql)


def split_extractions(apps, schema_editor):
    Extraction = apps.get_model("runs", "Extraction")
    ExtractStage = apps.get_model("runs", "ExtractStage")
    Checkpoint = apps.get_model("runs", "Checkpoint")
    Extraction.objects.filter(run__isnull=True).update(
        imported_at=F("queued_at"), imported_from=F("path"), created_at=F("queued_at"))
    doomed = []
    for row in Extraction.objects.filter(run__isnull=False).order_by("pk").iterator():
        stage = ExtractStage.objects.create(
            id=row.pk, run_id=row.run_id, target_id=row.target_id, layer_ids=row.layer_ids, out_dir=row.path,
            **{name: getattr(row, name) for name in (*STAGE_FIELDS, *MEASURED)})
        # queued_at is auto_now_add, which create() overwrote: put the original back.
        ExtractStage.objects.filter(pk=stage.pk).update(queued_at=row.queued_at)
        attached = (row.status == "succeeded" or _has_manifest(apps, row.pk)
                    or row.verifications.exists() or row.reviews.exists())
        if attached:
            Extraction.objects.filter(pk=row.pk).update(
                produced_by_id=stage.pk, created_at=Coalesce(F("finished_at"), F("queued_at")))
        else:
            doomed.append(row.pk)  # a stage that never wrote files has no artifact
    Extraction.objects.filter(pk__in=doomed).delete()
    Checkpoint.objects.filter(training_run__isnull=True).update(imported_at=F("created_at"))
    _reset_sequences(schema_editor.connection, ExtractStage)
    _check_deferred(schema_editor.connection)


def _has_manifest(apps, extraction_id) -> bool:
    return apps.get_model("runs", "Manifest").objects.filter(extraction_id=extraction_id).exists()


def join_extractions(apps, schema_editor):
    """Back to one row per run's extraction: the artifact takes its stage's state; a stage without
    artifact gets a row of its own, and its attempts follow it to that row's id."""
    Extraction = apps.get_model("runs", "Extraction")
    ExtractStage = apps.get_model("runs", "ExtractStage")
    StageAttempt = apps.get_model("runs", "StageAttempt")
    Checkpoint = apps.get_model("runs", "Checkpoint")
    Extraction.objects.filter(produced_by__isnull=True).update(imported=True, status="succeeded",
                                                               queued_at=F("created_at"))
    moves = {}
    for stage in ExtractStage.objects.order_by("pk").iterator():
        values = {"run_id": stage.run_id, **{name: getattr(stage, name) for name in (*STAGE_FIELDS, *MEASURED)}}
        artifact = Extraction.objects.filter(produced_by_id=stage.pk).first()
        if artifact is None:
            artifact = Extraction.objects.create(target_id=stage.target_id, layer_ids=stage.layer_ids,
                                                 path=stage.out_dir, **values)
        Extraction.objects.filter(pk=artifact.pk).update(**values)
        moves[stage.pk] = artifact.pk
    offset = 2**30  # two steps, so that no attempt lands on another's (stage, id, number) on the way
    for stage_id, extraction_id in moves.items():
        StageAttempt.objects.filter(stage="extract", record_id=stage_id).update(record_id=offset + extraction_id)
    StageAttempt.objects.filter(stage="extract", record_id__gte=offset).update(record_id=F("record_id") - offset)
    Checkpoint.objects.filter(imported_at__isnull=False).update(imported=True)
    _reset_sequences(schema_editor.connection, Extraction)
    _check_deferred(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0011_enqueue_outbox"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ExtractStage",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("status", models.CharField(choices=[("queued", "Queued"), ("running", "Running"), ("succeeded", "Succeeded"), ("failed", "Failed"), ("cancelled", "Cancelled")], db_index=True, default="queued", max_length=16)),
                ("queued_at", models.DateTimeField(auto_now_add=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("progress_done", models.BigIntegerField(default=0)),
                ("progress_total", models.BigIntegerField(default=0)),
                ("worker", models.CharField(blank=True, max_length=200)),
                ("error", models.TextField(blank=True)),
                ("log_tail", models.TextField(blank=True)),
                ("out_dir", models.CharField(blank=True, max_length=1000)),
                ("lease_expires_at", models.DateTimeField(blank=True, db_index=True, null=True)),
                ("layer_ids", models.JSONField(default=list, help_text="the hidden-state ids the stage captures")),
                ("device", models.CharField(blank=True, max_length=100)),
                ("model_load_seconds", models.FloatField(blank=True, null=True)),
                ("forward_seconds", models.FloatField(blank=True, null=True)),
                ("tokens_per_second", models.FloatField(blank=True, null=True)),
                ("run", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name="extract_stage", to="runs.pipelinerun")),
                ("target", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="extract_stages", to="runs.targetmodel")),
            ],
            options={
                "abstract": False,
            },
        ),
        migrations.RenameField(model_name="extraction", old_name="out_dir", new_name="path"),
        migrations.AddField(
            model_name="extraction",
            name="created_at",
            field=models.DateTimeField(auto_now_add=True, default=django.utils.timezone.now),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="extraction",
            name="produced_by",
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="extraction", to="runs.extractstage"),
        ),
        migrations.AddField(
            model_name="extraction",
            name="imported_by",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="imported_extractions", to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name="extraction",
            name="imported_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="extraction",
            name="imported_from",
            field=models.CharField(blank=True, help_text="the path the user gave", max_length=1000),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="imported_by",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="imported_checkpoints", to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="imported_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(split_extractions, join_extractions),
        *[migrations.RemoveField(model_name="extraction", name=name) for name in (
            "run", *STAGE_FIELDS, *MEASURED, "imported")],
        migrations.RemoveField(model_name="checkpoint", name="imported"),
        migrations.AlterField(
            model_name="extraction",
            name="path",
            field=models.CharField(help_text="the extraction's directory", max_length=1000),
        ),
        migrations.AlterField(
            model_name="stageattempt",
            name="record_id",
            field=models.PositiveIntegerField(help_text="the stage row's id (Preparation, ExtractStage, ...)"),
        ),
        migrations.AddConstraint(
            model_name="extraction",
            constraint=models.CheckConstraint(condition=models.Q(models.Q(("imported_at__isnull", True), ("imported_by__isnull", True), ("produced_by__isnull", False)), models.Q(("imported_at__isnull", False), ("produced_by__isnull", True)), _connector="OR"), name="extraction_produced_or_imported"),
        ),
        migrations.AddConstraint(
            model_name="checkpoint",
            constraint=models.CheckConstraint(condition=models.Q(models.Q(("imported_at__isnull", True), ("imported_by__isnull", True), ("training_run__isnull", False)), models.Q(("imported_at__isnull", False), ("training_run__isnull", True)), _connector="OR"), name="checkpoint_trained_or_imported"),
        ),
    ]
