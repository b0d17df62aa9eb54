"""A sweep hands at most `parallel` of its runs to the queues; each run that finishes (succeeds, fails,
is cancelled) hands over the next, so a large sweep never holds the queue ahead of other people's runs.
Handed over = an outbox row for the run's chain (non-transactional tests: never sent)."""
import pytest

from runs.models import Evaluation, PendingEnqueue, PipelineRun, StageStatus, SweepRun
from runs.pipeline import services as run_services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stages import STAGES
from runs.sweeps import selectors
from runs.sweeps.release import sweeps_release
from runs.sweeps.services import sweep_cancel, sweep_launch
from runs.sweeps.spec import parse_vary

pytestmark = pytest.mark.django_db


def launch(user, roots, vary="seed=1,2,3", parallel=1):
    return sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                        config=RunConfig(draft_vocab_size=64), varied=[parse_vary(vary)], parallel=parallel)


def handed_over() -> list[int]:
    return list(PendingEnqueue.objects.filter(kind="pipeline").order_by("pk").values_list("object_id", flat=True))


def run_ids(sweep) -> list[int]:
    return list(SweepRun.objects.filter(sweep=sweep).order_by("position").values_list("run_id", flat=True))


def finish(run_id: int) -> None:
    for stage in STAGES:
        stage.model.objects.filter(run_id=run_id).update(status=StageStatus.SUCCEEDED)


def test_one_at_a_time_the_next_follows_when_one_is_cancelled(user, roots):
    sweep = launch(user, roots)
    first, second, third = run_ids(sweep)
    assert handed_over() == [first]
    run_services.run_cancel(run=PipelineRun.objects.get(pk=first), user=user)
    assert handed_over() == [first, second]
    assert [r["status"] for r in selectors.sweep_summary(sweep=sweep)["runs"]] == ["cancelled", "queued", "held"]


def test_a_run_cancelled_while_held_is_skipped(user, roots):
    sweep = launch(user, roots)
    first, second, third = run_ids(sweep)
    run_services.run_cancel(run=PipelineRun.objects.get(pk=second), user=user)
    assert handed_over() == [first]  # the first still runs: nothing more goes
    finish(first)
    assert sweeps_release() == [third]  # what the workers' reconciler calls: the cancelled one is passed over
    assert handed_over() == [first, third]


def test_two_at_once_hand_over_two(user, roots):
    sweep = launch(user, roots, vary="seed=1,2,3,4", parallel=2)
    ids = run_ids(sweep)
    assert handed_over() == ids[:2]
    finish(ids[1])
    assert sweeps_release() == [ids[2]]
    assert sweeps_release() == []  # two unfinished in the queues: the fourth waits
    assert handed_over() == ids[:3]


def test_cancelling_the_sweep_cancels_the_held_runs_and_hands_nothing_over(user, roots):
    sweep = launch(user, roots)
    ids = run_ids(sweep)
    sweep_cancel(sweep=sweep, user=user)
    assert handed_over() == ids[:1]
    summary = selectors.sweep_summary(sweep=sweep)
    assert [r["status"] for r in summary["runs"]] == ["cancelled"] * 3 and summary["finished"]
    assert not SweepRun.objects.filter(released_at__isnull=True).exists()


def test_the_best_is_the_highest_measured_tau_and_a_tie_goes_to_the_earliest(user, roots):
    sweep = launch(user, roots, vary="seed=1,2,3,4", parallel=4)
    ids = run_ids(sweep)
    for run_id, tau in zip(ids, (2.1, 2.4, 2.4004, None)):
        finish(run_id)
        Evaluation.objects.filter(run_id=run_id).update(tau=tau)
    Evaluation.objects.filter(run_id=ids[3]).update(status=StageStatus.FAILED)
    summary = selectors.sweep_summary(sweep=sweep)
    assert summary["best"] == {"run_id": ids[1], "tau": 2.4, "settings": {"seed": "2"}, "tied_with": [ids[2]]}
    assert [r["is_best"] for r in summary["runs"]] == [False, True, False, False]
    assert summary["measured"] == 3 and summary["again_url"] == f"/runs/new/?copy={ids[1]}&more_data=1"



def test_a_run_that_fails_or_succeeds_on_a_worker_hands_over_the_next(user, roots):
    from runs.pipeline.lifecycle.stage_services import stage_fail, stage_record_id, stage_start, stage_succeed

    sweep = launch(user, roots)
    first, second, third = run_ids(sweep)
    prepare = stage_record_id(stage_name="prepare", run_id=first)
    stage_start(stage_name="prepare", record_id=prepare, worker="w")
    stage_fail(stage_name="prepare", record_id=prepare, error="boom", log_tail="")
    assert handed_over() == [first, second]
    for stage in STAGES[:-1]:
        stage.model.objects.filter(run_id=second).update(status=StageStatus.SUCCEEDED)
    evaluate = stage_record_id(stage_name="evaluate", run_id=second)
    stage_start(stage_name="evaluate", record_id=evaluate, worker="w")
    stage_succeed(stage_name="evaluate", record_id=evaluate, fields={"tau": 2.0}, log_tail="")
    assert handed_over() == [first, second, third]


def test_the_workers_page_counts_held_runs_apart_from_the_queue(user, roots, client):
    from runs.fleet.work_selectors import queued_work

    sweep = launch(user, roots)
    first, second, third = run_ids(sweep)
    # Runs of no sweep are held by none (the count once took every run without a sweep for a held one).
    alone = [run_services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                     config=RunConfig(), enqueue=False).pk for _ in range(2)]
    queue = queued_work()
    assert {item.run_id for item in queue["items"] if item.run_id} == {first, *alone}
    assert queue["held_by_sweeps"] == 2
    client.force_login(user)
    html = client.get("/workers/").content.decode()
    assert "2 runs held back by their sweeps: each joins the queue when an earlier run of its sweep finishes" in html
