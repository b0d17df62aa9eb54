"""Which waiting stage a queue's turn goes to (runs.pipeline.dispatch.launch_order), on PostgreSQL: the
earliest-launched run's, a sweep's run counting as launched when its sweep releases it, and never
one that another worker holds the message of."""
import pytest

from runs.models import PipelineRun, StageStatus
from runs.pipeline import services as run_services
from runs.pipeline.dispatch.launch_order import stage_choose, waiting_in_queue
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stage_services import stage_start, stage_succeed
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary

pytestmark = pytest.mark.django_db


def launch(user, roots) -> PipelineRun:
    return run_services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                   config=RunConfig(draft_vocab_size=64))


def test_a_sweeps_run_is_launched_when_its_sweep_releases_it(user, roots):
    sweep = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                         config=RunConfig(draft_vocab_size=64), varied=[parse_vary("seed=1,2")], parallel=1)
    held_first, held_second = sweep.entries.order_by("position").values_list("run_id", flat=True)
    other = launch(user, roots)  # launched while the sweep held its second run
    assert waiting_in_queue(queue="cpu") == [("prepare", held_first), ("prepare", other.pk)]
    run_services.run_cancel(run=PipelineRun.objects.get(pk=held_first), user=user)  # releases the next one
    # The second run of the sweep was created before `other`, but joined the queues after it.
    assert held_second < other.pk
    assert waiting_in_queue(queue="cpu") == [("prepare", other.pk), ("prepare", held_second)]


def test_a_turn_goes_to_the_earliest_run_no_other_worker_holds(user, roots):
    first, second, third = launch(user, roots), launch(user, roots), launch(user, roots)
    # The worker that took third's message is given first's prepare, claimed for it.
    assert stage_choose(stage_name="prepare", run_id=third.pk, worker="a@host") == ("prepare", first.pk)
    first.preparation.refresh_from_db()
    assert first.preparation.worker == "a@host" and first.preparation.status == StageStatus.QUEUED
    # Another worker's turn skips the stage a@host holds.
    assert stage_choose(stage_name="prepare", run_id=first.pk, worker="b@host") == ("prepare", second.pk)
    # Once first's prepare ran, its extract waits in gpu, not cpu: the cpu turn goes on to third.
    stage_start(stage_name="prepare", record_id=first.preparation.pk, worker="a@host")
    stage_succeed(stage_name="prepare", record_id=first.preparation.pk, fields={}, log_tail="")
    assert stage_choose(stage_name="prepare", run_id=first.pk, worker="c@host") == ("prepare", third.pk)
    assert waiting_in_queue(queue="gpu") == [("extract", first.pk)]
    # No stage waits that nobody holds: the turn goes to nothing.
    assert stage_choose(stage_name="prepare", run_id=first.pk, worker="d@host") is None
