"""A stage split into shards (issue 36) over two real Celery workers with different names (standing for two
hosts), on PostgreSQL and Redis: the extraction is made by both, its files are byte for byte one worker's,
a worker SIGKILLed in the middle of a shard costs that shard one more attempt, and a failed shard fails
the stage, naming it, while Retry runs only that shard."""
import json
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from runs.models import ExtractStage, Preparation, StageShard, StageStatus, VocabMapping
from runs.pipeline import services
from runs.pipeline.run_config import RunConfig
from tests.worker import celery_worker, kill_worker_hard, wait_for_run
from workers.stages.shards import shard_dir

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Short enough that a lost worker is noticed within seconds (see tests/e2e/test_worker_faults.py).
ENV = {"EAGLE3WEB_STAGE_LEASE_SECONDS": "6", "EAGLE3WEB_TORCH_THREADS": "1"}
CONFIG = dict(max_seq_len=128, draft_vocab_size=256, epochs=1, ttt_steps=1, eval_prompts=2, eval_max_new_tokens=8,
              shards=2)
MEASURED = {"total_time_seconds", "model_load_seconds", "forward_seconds", "tokens_per_second", "created_at",
            "time_split_s"}


def wait_until(predicate, *, timeout: float, what: str, poll: float = 0.2, logs=()) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tails = "\n".join(Path(p).read_text()[-3000:] for p in logs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(poll)


@contextmanager
def two_workers(data_root, tmp_path, env):
    """Workers a and b, each one pool slot; yields {name prefix: process}."""
    with ExitStack() as stack:
        procs = {"a": stack.enter_context(celery_worker(data_root=data_root, log_path=tmp_path / "a.log", name="a",
                                                        extra_env=env))}
        procs["b"] = stack.enter_context(celery_worker(data_root=data_root, log_path=tmp_path / "b.log", name="b",
                                                       extra_env=env, purge=False))
        yield procs


def launch(user, tiny_target, **config):
    return services.run_launch(user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                               config=RunConfig(**{**CONFIG, **config}))


def status_of(model, run):
    return model.objects.filter(run=run).values_list("status", flat=True).get()


def one_worker_extraction(tiny_target, run, out_dir, batch_tokens=None):
    from workers.stages.extract.with_transformers import extract

    prepared = Preparation.objects.get(run=run)
    return extract(target_dir=tiny_target.target_dir, prepared_dir=Path(prepared.out_dir), out_dir=out_dir,
                   layer_ids=ExtractStage.objects.get(run=run).layer_ids, device="cpu", batch_tokens=batch_tokens)


def assert_same_extraction(sharded: Path, single: Path, resumed: bool = False) -> None:
    """Every file byte for byte, and the manifest but for what is measured (and, `resumed`, what an attempt
    after a lost one counts as kept rather than extracted)."""
    ignored = MEASURED | ({"samples_reused", "tokens_extracted"} if resumed else set())
    def tree(root):
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    mine, theirs = tree(sharded), tree(single)
    assert mine == theirs and "shards" not in {Path(p).parts[0] for p in mine}
    for name in sorted(mine - {"data_config.json"}):
        assert (sharded / name).read_bytes() == (single / name).read_bytes(), name
    a, b = (json.loads((root / "data_config.json").read_text()) for root in (sharded, single))
    assert {k: v for k, v in a.items() if k not in ignored} == {k: v for k, v in b.items() if k not in ignored}


def shard_files(hs_dir: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in hs_dir.glob("hs_*.safetensors")}


def test_an_extraction_in_two_shards_is_made_by_both_workers_and_equals_one_workers(
        tiny_target, data_root, tmp_path, user):
    with two_workers(data_root, tmp_path, ENV) as procs:
        run = launch(user, tiny_target, max_samples=80)
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        # The merged stage hands the run over as a whole one does: its vocabulary follows.
        wait_until(lambda: status_of(VocabMapping, run) in (StageStatus.SUCCEEDED, StageStatus.FAILED),
                   timeout=300, what="the vocabulary after the split extraction", logs=logs)
        services.run_cancel(run=run, user=user)
    assert status_of(ExtractStage, run) == StageStatus.SUCCEEDED
    shards = list(StageShard.objects.filter(run=run, stage="extract").order_by("index"))
    assert [s.status for s in shards] == [StageStatus.SUCCEEDED] * 2
    assert {s.worker.split("-")[0] for s in shards} == set(procs)  # a and b each ran one
    assert shards[0].row_start == 0 and shards[0].row_stop == shards[1].row_start
    assert shards[1].row_stop == Preparation.objects.get(run=run).num_rows and [s.attempts for s in shards] == [1, 1]
    single = one_worker_extraction(tiny_target, run, tmp_path / "one")
    assert_same_extraction(Path(run.output_dir) / "extraction", single.out_dir)


def test_a_worker_killed_in_a_shard_costs_that_shard_one_more_attempt_and_the_run_succeeds(
        tiny_target, data_root, tmp_path, user):
    # One row per forward: the shard takes seconds, time enough to kill its worker in the middle.
    env = {**ENV, "EAGLE3WEB_EXTRACT_BATCH_TOKENS": "1"}
    with two_workers(data_root, tmp_path, env) as procs:
        run = launch(user, tiny_target, max_samples=60)
        out = Path(run.output_dir) / "extraction"
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        wait_until(lambda: len(shard_files(shard_dir(out, 1) / "hidden_states")) >= 5, timeout=300, poll=0.05,
                   what="shard 1 to have written 5 samples", logs=logs)
        shard = StageShard.objects.get(run=run, stage="extract", index=1)
        assert shard.status == StageStatus.RUNNING and shard.rows_done < shard.rows
        killed = shard.worker
        kill_worker_hard(procs[killed.split("-")[0]])
        summary = wait_for_run(run.pk, timeout=600, log_path=logs[0])
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, [s.get("error") for s in summary["stages"]]
    shard.refresh_from_db()
    assert shard.attempts == 2 and shard.worker != killed
    assert f"attempt 1 lost: worker {killed} stopped answering" in shard.log_tail
    assert "attempt 2 started on" in shard.log_tail
    stage = ExtractStage.objects.get(run=run)
    assert f"shard 1 ({shard.span_label}) sent again: worker {killed} stopped answering" in stage.log_tail
    assert StageShard.objects.get(run=run, stage="extract", index=0).attempts == 1
    manifest = json.loads((out / "data_config.json").read_text())
    assert manifest["samples_reused"] >= 5  # the second attempt kept what the first wrote whole
    assert_same_extraction(out, one_worker_extraction(tiny_target, run, tmp_path / "one", batch_tokens=1).out_dir,
                           resumed=True)


def test_a_failed_shard_fails_the_stage_naming_it_and_retry_runs_only_that_shard(
        tiny_target, data_root, tmp_path, user):
    with two_workers(data_root, tmp_path, ENV):
        run = launch(user, tiny_target, max_samples=80)
        out = Path(run.output_dir) / "extraction"
        blocker = shard_dir(out, 1)  # a file where shard 1's folder goes: its extraction cannot start
        blocker.parent.mkdir(parents=True)
        blocker.write_text("in the way")
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        wait_until(lambda: status_of(ExtractStage, run) == StageStatus.FAILED and StageShard.objects.filter(
            run=run, index=0, status=StageStatus.SUCCEEDED).exists(), timeout=300,
            what="shard 1 to fail the stage and shard 0 to finish", logs=logs)
        failed = StageShard.objects.get(run=run, index=1)
        stage = ExtractStage.objects.get(run=run)
        assert failed.status == StageStatus.FAILED and failed.worker
        assert stage.error.startswith(f"shard 1 (rows {failed.row_start}–{failed.row_stop - 1}) failed on worker "
                                      f"{failed.worker}: ")
        assert "NotADirectoryError" in failed.error and str(blocker) in failed.error  # its cause, for developers
        kept = shard_files(shard_dir(out, 0) / "hidden_states")
        assert len(kept) == StageShard.objects.get(run=run, index=0).rows
        blocker.unlink()
        services.run_retry(run=run, user=user)
        wait_until(lambda: status_of(ExtractStage, run) == StageStatus.SUCCEEDED, timeout=300,
                   what="the retried extraction", logs=logs)
        services.run_cancel(run=run, user=user)
    shards = list(StageShard.objects.filter(run=run).order_by("index"))
    assert [s.attempts for s in shards] == [1, 2] and [s.status for s in shards] == [StageStatus.SUCCEEDED] * 2
    merged = shard_files(out / "hidden_states")
    assert all(merged[name] == stat for name, stat in kept.items())  # the same files, moved, never rewritten
    assert_same_extraction(out, one_worker_extraction(tiny_target, run, tmp_path / "one").out_dir)
