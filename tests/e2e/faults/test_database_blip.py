"""PostgreSQL unreachable for a while mid-training: the worker reaches the database through a TCP
proxy the test cuts (open connections closed, new ones refused) and restores. The stage rides it
out and the run succeeds, in one attempt, with no metric point written twice."""
import time
from urllib.parse import urlsplit

import pytest

from runs.pipeline import services
from runs.tracking.curves import series_points
from runs.models import MetricSeries, StageAttempt, StageStatus, TrainingRun
from runs.pipeline.launch.run_config import RunConfig
from tests.e2e.faults.test_worker_faults import wait_until
from tests.helpers.outage import tcp_proxy
from tests.helpers.worker import celery_worker, wait_for_run
from tests.helpers.worker import test_database_url as database_url  # renamed: pytest would collect it

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BLIP_SECONDS = 15
# Longer than the blip: a worker cut off this briefly is still the stage's owner.
LEASE = {"EAGLE3WEB_STAGE_LEASE_SECONDS": "40"}


def test_a_database_blip_mid_training_does_not_stop_the_run(tiny_target, data_root, tmp_path, user):
    db = urlsplit(database_url())
    with tcp_proxy(upstream=(db.hostname, db.port or 5432)) as proxy:
        via_proxy = db._replace(netloc=f"{db.netloc.rsplit('@', 1)[0]}@127.0.0.1:{proxy.port}").geturl()
        log = tmp_path / "worker.log"
        with celery_worker(data_root=data_root, log_path=log, extra_env={**LEASE, "DATABASE_URL": via_proxy}):
            run = services.run_launch(
                user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                config=RunConfig(max_samples=40, max_seq_len=256, draft_vocab_size=256, epochs=25, ttt_steps=2,
                                 eval_prompts=4, eval_max_new_tokens=16),
            )
            training = TrainingRun.objects.filter(run=run)
            wait_until(lambda: training.filter(status=StageStatus.RUNNING, progress_done__gte=2).exists(),
                       timeout=300, what="training to be under way")
            proxy.cut()
            time.sleep(BLIP_SECONDS)
            proxy.restore()
            summary = wait_for_run(run.pk, timeout=600, log_path=log)
        worker_log = log.read_text()
    assert proxy.cuts == 1
    assert "the database is not answering" in worker_log  # the blip did reach the stage's writes
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, [
        (s["name"], s["status"], s["error"]) for s in summary["stages"]]
    attempts = StageAttempt.objects.filter(run=run, stage="train").values_list("outcome", flat=True)
    assert list(attempts) == ["succeeded"]
    curves = list(MetricSeries.objects.filter(training_run__run=run))
    assert curves
    for series in curves:
        steps = series_points(series=series).steps
        # no step twice (a write retried after a commit whose answer the blip lost is refused, and counted)
        assert len(steps) == series.num_points and (steps[1:] > steps[:-1]).all(), series
