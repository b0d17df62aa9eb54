"""Many runs fast for the list tests: one launched for real, the others copies of its rows made in bulk
(as bench/tracker/metrics.py makes its 10,000)."""
from runs.models import PipelineRun
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stages import STAGES


def runs_made(count, *, roots, user, project=None, names=None, notes=None, config=None):
    """`count` runs of `user` in `project` (a name; None: their default), named names[i] or "run i"."""
    names = names or [f"run {i}" for i in range(count)]
    notes = notes or [""] * count
    first = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                config=config or RunConfig(), name=names[0], notes=notes[0], enqueue=False,
                                project=project)
    copies = PipelineRun.objects.bulk_create([
        PipelineRun(owner=user, target=first.target, dataset=first.dataset, name=names[i], notes=notes[i],
                    config=first.config, project=first.project) for i in range(1, count)])
    for stage in STAGES:
        row = getattr(first, stage.related_name)
        values = {f.attname: getattr(row, f.attname) for f in stage.model._meta.concrete_fields
                  if f.name not in ("id", "run")}
        stage.model.objects.bulk_create([stage.model(run=run, **values) for run in copies])
    return [first, *copies]
