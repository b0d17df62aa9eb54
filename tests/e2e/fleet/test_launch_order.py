"""Two runs on one real Celery worker (cpu and gpu queues, one task at a time, Redis, PostgreSQL):
within a queue, no stage of the later run starts while a stage of the earlier run is ready and
waiting there (runs.pipeline.dispatch.launch_order)."""
import pytest

from runs.models import StageAttempt, StageStatus
from runs.pipeline import services
from runs.pipeline.dispatch.routing import stage_queue
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stages import STAGES
from tests.helpers.worker import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NAMES = [stage.name for stage in STAGES]


def _waits(run) -> dict[str, tuple]:
    """stage -> (queue, ready at, started at): ready when the run's previous stage finished (the
    launch, for its first stage), as the worker's own attempt rows recorded it."""
    attempts = {a.stage: a for a in StageAttempt.objects.filter(run=run)}
    assert sorted(attempts) == sorted(NAMES), attempts  # one attempt each: no stage ran twice
    waits = {}
    for index, name in enumerate(NAMES):
        ready = run.created_at if index == 0 else attempts[NAMES[index - 1]].finished_at
        waits[name] = (stage_queue(stage_name=name, config=run.config), ready, attempts[name].started_at)
    return waits


def test_every_waiting_stage_of_the_first_run_goes_before_the_seconds(tiny_target, worker, user):
    config = RunConfig(max_samples=20, max_seq_len=256, draft_vocab_size=128, epochs=1, ttt_steps=1)
    first, second = (services.run_launch(user=user, target_path=tiny_target.target_dir,
                                         dataset_path=tiny_target.chats_path, config=config) for _ in range(2))
    for run in (first, second):
        summary = wait_for_run(run.pk, timeout=600, log_path=worker.log_path)
        assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, summary["stages"]
    first.refresh_from_db()
    second.refresh_from_db()
    earlier, later = _waits(first), _waits(second)
    overtaken = [(mine, theirs) for mine, (queue, ready, started) in earlier.items()
                 for theirs, (their_queue, _, their_start) in later.items()
                 if their_queue == queue and ready < their_start < started]
    assert not overtaken, (f"the second run's stage started while the first's waited in the same queue: {overtaken}"
                           f"\nfirst: {earlier}\nsecond: {later}")
