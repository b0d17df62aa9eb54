"""On-policy data end to end, with the transformers backend on the demo target (the vLLM backend's own
tests are in tests/e2e/vllm/test_regenerate_vllm.py): `regenerate_dataset --inline` makes a dataset with its
lineage, asking again returns it, a run trains on it and says it is on-policy; a real Celery worker killed
mid-way is replaced and the file holds each conversation once."""
from __future__ import annotations

import io
import json
import time
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command

from runs.data.curation import dataset_samples_sync, samples_set_excluded
from runs.data.regeneration import RegenerationSettings, dataset_regenerate_request
from runs.models import Dataset, DatasetSample, StageAttempt, StageStatus
from runs.pipeline import services
from runs.pipeline.jobs.models import DatasetRegeneration
from tests.helpers.worker import celery_worker, kill_worker_hard

pytestmark = [pytest.mark.slow]

SHORT_LEASE = {"EAGLE3WEB_STAGE_LEASE_SECONDS": "6", "EAGLE3WEB_TORCH_THREADS": "1"}


def _cli(name: str, *args) -> dict:
    out = io.StringIO()
    call_command(name, *args, "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def _first_rows(source: Path, dest: Path, count: int) -> Path:
    dest.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:count]), encoding="utf-8")
    return dest


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _turns(row: dict) -> list[tuple[str, str]]:
    """(role, text) of a row in either format."""
    if "messages" in row:
        return [(m["role"], m["content"]) for m in row["messages"]]
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    return [(roles[m["from"]], m["value"]) for m in row["conversations"]]


@pytest.mark.django_db
def test_regenerate_inline_makes_a_dataset_with_lineage_and_a_run_trains_on_it(tiny_target, data_root, tmp_path, user):
    chats = _first_rows(tiny_target.chats_path, tmp_path / "chats.jsonl", 14)
    source = services.dataset_register(path=chats)
    dataset_samples_sync(dataset=source)
    excluded = DatasetSample.objects.filter(dataset=source).order_by("line")[3]
    samples_set_excluded(samples=DatasetSample.objects.filter(pk=excluded.pk), excluded=True, user=user)

    args = ["--target", str(tiny_target.target_dir), "--dataset", str(chats), "--backend", "transformers",
            "--max-new-tokens", "24", "--inline"]
    made = _cli("regenerate_dataset", *args)
    assert made["status"] == StageStatus.SUCCEEDED, made
    out = Path(made["path"])
    assert out.is_file() and out.parent == chats.parent / "regenerated"
    rows, originals = _rows(out), _rows(chats)
    by_id = {str(r.get("id", i)): r for i, r in enumerate(originals)}
    # Every conversation but the excluded one, each once, in the source's own format.
    assert Counter(str(r["id"]) for r in rows) == Counter(k for k in by_id if k != excluded.sample_id)
    assert made["conversations"] == 13 and made["regenerated_from"]["skipped_excluded"] == 1
    user_turns = sum(sum(role == "user" for role, _ in _turns(r)) for r in rows)
    replies = [text for r in rows for role, text in _turns(r) if role == "assistant"]
    assert made["turns_regenerated"] == user_turns == len(replies)
    assert made["replies_cut"] == sum(len(r["regenerated"]["cut_turns"]) for r in rows)
    for row in rows:
        original = by_id[str(row["id"])]
        assert ("messages" in row) == ("messages" in original)
        assert [t for t in _turns(row) if t[0] != "assistant"] == [t for t in _turns(original) if t[0] != "assistant"]
    lineage = made["regenerated_from"]
    assert lineage["dataset_id"] == source.pk and lineage["backend"] == "transformers"
    assert lineage["target"] == str(tiny_target.target_dir) and len(lineage["content_sha256"]) == 64
    assert Dataset.objects.get(pk=made["dataset_id"]).path == str(out)

    # Asked again with the same settings: the same dataset, nothing run again.
    attempts = StageAttempt.objects.filter(stage="regenerate").count()
    again = _cli("regenerate_dataset", *args)
    assert (again["regeneration_id"], again["dataset_id"]) == (made["regeneration_id"], made["dataset_id"])
    assert StageAttempt.objects.filter(stage="regenerate").count() == attempts

    run = _cli("run_pipeline", "--target", str(tiny_target.target_dir), "--dataset", str(out), "--layer-ids", "2,4,5",
               "--max-seq-len", "256", "--draft-vocab-size", "256", "--epochs", "1", "--ttt-steps", "2",
               "--val-fraction", "0.3", "--eval-prompts", "3", "--eval-max-new-tokens", "8", "--inline")
    assert run["status"] == StageStatus.SUCCEEDED, run["stages"]
    assert run["dataset"]["on_policy"] is True and run["regenerated_from"]["dataset_id"] == source.pk
    assert run["tokens"]["conversations"] == 13


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_regeneration_is_replaced_and_no_conversation_is_written_twice(
        tiny_target, data_root, tmp_path, user):
    chats = _first_rows(tiny_target.chats_path, tmp_path / "chats.jsonl", 60)
    target = services.target_register(path=tiny_target.target_dir)
    source = services.dataset_register(path=chats)
    settings = RegenerationSettings(backend="transformers", max_new_tokens=40)
    with celery_worker(data_root=data_root, log_path=tmp_path / "first.log", extra_env=SHORT_LEASE) as first:
        deadline = time.monotonic() + 60
        while True:  # the worker's heartbeat row: a request is refused while no live worker takes "gpu"
            try:
                job, _ = dataset_regenerate_request(dataset=source, target=target, settings=settings, user=user)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        partial = Path(job.output_path + ".partial")
        deadline = time.monotonic() + 300
        while not (partial.is_file() and partial.read_text(encoding="utf-8").count("\n") >= 3):
            assert time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.05)
        kill_worker_hard(first)
    written_before = partial.read_text(encoding="utf-8").count("\n")
    assert DatasetRegeneration.objects.get(pk=job.pk).status == StageStatus.RUNNING
    with celery_worker(data_root=data_root, log_path=tmp_path / "second.log", extra_env=SHORT_LEASE):
        deadline = time.monotonic() + 600
        while DatasetRegeneration.objects.get(pk=job.pk).status != StageStatus.SUCCEEDED:
            job.refresh_from_db()
            assert job.status in (StageStatus.QUEUED, StageStatus.RUNNING), job.error
            assert time.monotonic() < deadline, (tmp_path / "second.log").read_text()[-3000:]
            time.sleep(0.5)
    job.refresh_from_db()
    rows = _rows(Path(job.output_path))
    ids = Counter(str(r["id"]) for r in rows)
    assert len(ids) == 60 and set(ids.values()) == {1}
    assert job.conversations == 60 and job.resumed_from >= written_before >= 3
    assert job.turns_regenerated == sum(sum(role == "user" for role, _ in _turns(r)) for r in rows)
    outcomes = list(StageAttempt.objects.filter(stage="regenerate", record_id=job.pk).order_by("number")
                    .values_list("outcome", flat=True))
    assert outcomes == ["failed", "succeeded"]
    assert job.dataset is not None and job.dataset.regeneration.pk == job.pk
