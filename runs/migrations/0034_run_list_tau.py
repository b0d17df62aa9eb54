# The runs list's τ on the run's row (runs.pipeline.list_tau; issue 40; hand-written): the column, then each
# existing run's from its training's best_tau, else its evaluate stage's τ, in one statement.
from django.db import migrations, models
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Coalesce


def list_tau_fill(apps, schema_editor):
    PipelineRun = apps.get_model("runs", "PipelineRun")
    TrainingRun = apps.get_model("runs", "TrainingRun")
    Evaluation = apps.get_model("runs", "Evaluation")
    PipelineRun.objects.update(list_tau=Coalesce(
        Subquery(TrainingRun.objects.filter(run_id=OuterRef("pk")).values("best_tau")[:1]),
        Subquery(Evaluation.objects.filter(run_id=OuterRef("pk")).values("tau")[:1])))


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0033_search_trigrams'),
    ]

    operations = [
        migrations.AddField(
            model_name='pipelinerun',
            name='list_tau',
            field=models.FloatField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(list_tau_fill, migrations.RunPython.noop),
    ]
