"""A stage split into shards (issue 36) over two real Celery workers with different names (standing for two
hosts), on PostgreSQL and Redis: a run's prepare, extraction and evaluation, and a regeneration, are made by
both, their outputs one worker's (files byte for byte, the same τ), a worker SIGKILLed in the middle of a shard costs
that shard one more attempt, and a failed shard fails the stage, naming it, while Retry runs only that shard."""
import json
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from runs.models import Evaluation, ExtractStage, Preparation, StageShard, StageStatus
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES
from tests.helpers.worker import celery_worker, kill_worker_hard, wait_for_run
from workers.stages.prepare.merge import prepare_count_rows
from workers.stages.shards import shard_dir

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Short enough that a lost worker is noticed within seconds (see tests/e2e/faults/test_worker_faults.py).
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
def two_workers(data_root, tmp_path, env, env_b=None):
    """Workers a and b, each one pool slot (b with `env_b` when given); yields {name prefix: process}."""
    with ExitStack() as stack:
        procs = {"a": stack.enter_context(celery_worker(data_root=data_root, log_path=tmp_path / "a.log", name="a",
                                                        extra_env=env))}
        procs["b"] = stack.enter_context(celery_worker(data_root=data_root, log_path=tmp_path / "b.log", name="b",
                                                       extra_env=env_b or env, purge=False))
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


def bytes_under(folder: Path) -> int:
    """What a folder holds on disk (0 when it is gone)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def shard_files(hs_dir: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in hs_dir.glob("hs_*.safetensors")}


def one_worker_preparation(tiny_target, run, out_dir):
    from workers.stages.prepare.stage import prepare

    return prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=tiny_target.chats_path, out_dir=out_dir,
                   max_seq_len=run.config["max_seq_len"], max_samples=run.config.get("max_samples"))


def one_worker_evaluation(evaluation):
    from django.conf import settings

    from runs.checkpoints.evaluation import evaluation_plan
    from workers.stages.evaluate.measure import evaluate
    from workers.stages.evaluate.prompts import prompts_load

    plan = evaluation_plan(evaluation=evaluation)
    return evaluate(target_dir=plan.target_dir, checkpoint_dir=plan.checkpoint_dir, prompts=prompts_load(plan.prompts),
                    prompt_source=plan.prompt_source, max_new_tokens=evaluation.max_new_tokens,
                    num_speculative_tokens=evaluation.num_speculative_tokens, device="cpu",
                    k_beyond=settings.EAGLE3WEB_K_BEYOND_TRAINED)


def by_both(run, stage: str, record_id: int | None = None) -> list:
    rows = StageShard.objects.filter(stage=stage, **({"run": run} if run else {"record_id": record_id}))
    shards = list(rows.order_by("index"))
    assert [s.status for s in shards] == [StageStatus.SUCCEEDED] * 2, stage
    assert {s.worker.split("-")[0] for s in shards} == {"a", "b"}, stage  # a and b each ran one
    assert shards[0].row_start == 0 and shards[0].row_stop == shards[1].row_start and [s.attempts for s in shards] == [1, 1]
    return shards


def test_a_run_in_two_shards_is_made_by_both_workers_and_equals_one_workers(tiny_target, data_root, tmp_path, user):
    """One run, every stage that splits split in two: the prepared folder and the extraction byte for byte one
    worker's, the evaluation's τ, counts and k table one worker's (tests/stages/ compares them on more shapes).
    Worker b's own forward budget is half a's (as a GPU host's default differs from a CPU host's): each shard
    runs the batches of the budget its stage was split with, stored on its row, wherever it runs."""
    with two_workers(data_root, tmp_path, ENV, {**ENV, "EAGLE3WEB_EXTRACT_BATCH_TOKENS": "1024"}):
        run = launch(user, tiny_target, max_samples=80)
        summary = wait_for_run(run.pk, timeout=600, log_path=tmp_path / "a.log")
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, [s.get("error") for s in summary["stages"]]
    preparation = Preparation.objects.get(run=run)
    assert by_both(run, "prepare")[1].row_stop == prepare_count_rows(tiny_target.chats_path)
    one = one_worker_preparation(tiny_target, run, tmp_path / "one-prepared")
    for name in ("data-00000-of-00001.arrow", "state.json", "dataset_info.json", "token_freq.pt"):
        assert (Path(preparation.out_dir) / name).read_bytes() == (one.out_dir / name).read_bytes(), name
    assert preparation.num_rows == one.num_rows
    extract_shards = by_both(run, "extract")
    assert extract_shards[1].row_stop == preparation.num_rows
    planned = {s.batch_tokens for s in extract_shards}
    assert len(planned) == 1 and planned <= {1024, 2048}, planned  # the planner's, a's default or b's setting
    assert_same_extraction(Path(run.output_dir) / "extraction",
                           one_worker_extraction(tiny_target, run, tmp_path / "one", batch_tokens=planned.pop()).out_dir)
    evaluation = Evaluation.objects.get(run=run)
    assert by_both(run, "evaluate")[1].row_stop == evaluation.num_prompts == CONFIG["eval_prompts"]
    single = one_worker_evaluation(evaluation)
    for name in ("tau", "acceptance_per_position", "new_tokens", "verify_forwards", "num_prompts",
                 "mismatched_prompts", "output_matches_greedy", "k_table", "recommended_k"):
        assert getattr(evaluation, name) == getattr(single, name), name
    # The parts are gone once merged: no byte of them is left beside the outputs.
    from workers.orchestration.shard_stage_runners import evaluate_parts_dir, prepare_parts_dir

    assert (bytes_under(prepare_parts_dir(preparation)), bytes_under(evaluate_parts_dir(evaluation))) == (0, 0)
    assert not prepare_parts_dir(preparation).exists() and not evaluate_parts_dir(evaluation).parent.exists()


def test_a_regeneration_in_two_shards_is_made_by_both_workers_and_equals_one_workers(
        tiny_target, data_root, tmp_path, user):
    from runs.data.regeneration import RegenerationSettings, dataset_regenerate_request
    from runs.pipeline.jobs.models import DatasetRegeneration
    from workers.stages.regenerate.base import RegenerateSettings
    from workers.stages.regenerate.stage import regenerate

    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(tiny_target.chats_path.read_text(encoding="utf-8").splitlines(keepends=True)[:6]))
    target, source = services.target_register(path=tiny_target.target_dir), services.dataset_register(path=chats)
    with two_workers(data_root, tmp_path, ENV):
        # Seeded sampling, not greedy: a reply's seed must not depend on the shard it falls in.
        asked = RegenerationSettings(backend="transformers", max_new_tokens=6, temperature=0.8, seed=7, shards=2)
        wait_until(lambda: _regeneration_asked(dataset_regenerate_request, source, target, asked, user), timeout=60,
                   what="a live worker to take the regeneration's queue")
        job = DatasetRegeneration.objects.get(source=source)
        wait_until(lambda: DatasetRegeneration.objects.get(pk=job.pk).status in FINISHED_STATUSES, timeout=300,
                   what="the regeneration", logs=[tmp_path / "a.log", tmp_path / "b.log"])
    job.refresh_from_db()
    assert job.status == StageStatus.SUCCEEDED and job.shards == 2, job.error
    assert by_both(None, "regenerate", job.pk)[1].row_stop == job.conversations == 6
    one = regenerate(target_dir=tiny_target.target_dir, source_path=chats, out_path=tmp_path / "one.jsonl",
                     backend="transformers", device="cpu",
                     settings=RegenerateSettings(max_new_tokens=6, temperature=0.8, seed=7))
    assert Path(job.output_path).read_bytes() == Path(one.out_path).read_bytes()
    from workers.orchestration.shard_stage_runners import regenerate_parts_dir

    assert bytes_under(regenerate_parts_dir(job)) == 0 and not regenerate_parts_dir(job).parent.exists()
    assert (job.turns_regenerated, job.replies_cut, job.failures) == (one.turns_regenerated, one.replies_cut, 0)


def _regeneration_asked(request, source, target, asked, user) -> bool:
    """The request is refused until a live worker takes the backend's queue (runs.data.regeneration)."""
    from django.db import transaction

    from workers.contract.errors import InputError

    try:
        with transaction.atomic():
            request(dataset=source, target=target, settings=asked, user=user)
        return True
    except InputError:
        return False


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
            run=run, stage="extract", index=0, status=StageStatus.SUCCEEDED).exists(), timeout=300,
            what="shard 1 to fail the stage and shard 0 to finish", logs=logs)
        failed = StageShard.objects.get(run=run, stage="extract", index=1)
        stage = ExtractStage.objects.get(run=run)
        assert failed.status == StageStatus.FAILED and failed.worker
        assert stage.error.startswith(f"shard 1 (rows {failed.row_start}–{failed.row_stop - 1}) failed on worker "
                                      f"{failed.worker}: ")
        assert "NotADirectoryError" in failed.error and str(blocker) in failed.error  # its cause, for developers
        kept = shard_files(shard_dir(out, 0) / "hidden_states")
        assert len(kept) == StageShard.objects.get(run=run, stage="extract", index=0).rows
        # Kept for Retry: the failed stage's parts (every byte of shard 0's); the prepare, merged, left none.
        assert bytes_under(shard_dir(out, 0)) >= sum((shard_dir(out, 0) / "hidden_states" / n).stat().st_size
                                                     for n in kept) > 0
        assert not (Path(run.output_dir) / "prepare_parts").exists()
        blocker.unlink()
        services.run_retry(run=run, user=user)
        wait_until(lambda: status_of(ExtractStage, run) == StageStatus.SUCCEEDED, timeout=300,
                   what="the retried extraction", logs=logs)
        services.run_cancel(run=run, user=user)
    shards = list(StageShard.objects.filter(run=run, stage="extract").order_by("index"))
    assert [s.attempts for s in shards] == [1, 2] and [s.status for s in shards] == [StageStatus.SUCCEEDED] * 2
    merged = shard_files(out / "hidden_states")
    assert all(merged[name] == stat for name, stat in kept.items())  # the same files, moved, never rewritten
    assert_same_extraction(out, one_worker_extraction(tiny_target, run, tmp_path / "one").out_dir)
