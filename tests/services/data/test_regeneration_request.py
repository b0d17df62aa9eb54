"""Asking for a regeneration (runs.data.regeneration): the same settings give the same job and file, other
settings or other curation another; bad input is refused naming the problem and stores nothing; cancel and
retry; lineage in the launch form's list, the run summary and the comparison.

No model runs here (tests/e2e/test_regenerate_dataset.py regenerates for real): the target directories
hold a tokenizer file and a chat template, which is all a request checks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from runs.data.regeneration import (
    RegenerationRequestError,
    RegenerationSettings,
    dataset_regenerate_request,
    regeneration_cancel,
    regeneration_retry,
)
from runs.data.regeneration_selectors import dataset_options, run_data_policy
from runs.models import DatasetSample, PendingEnqueue, StageStatus
from runs.pipeline import services
from runs.pipeline.jobs.models import DatasetRegeneration
from runs.pipeline.launch.run_config import RunConfig
from tests.helpers.fleet import cpu_worker

pytestmark = pytest.mark.django_db

TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"


def _target(root: Path, name: str = "target", *, template: str | None = TEMPLATE, tokenizer: bool = True) -> Path:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "num_hidden_layers": 4, "hidden_size": 32, "vocab_size": 300}))
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    config = {"eos_token": "</s>", **({"chat_template": template} if template is not None else {})}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def world(data_root, tmp_path):
    chats = tmp_path / "chats.jsonl"
    rows = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i} ünïcødé 🚀"},
                                               {"from": "gpt", "value": f"answer {i}"}]} for i in range(5)]
    chats.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    target = services.target_register(path=_target(tmp_path))
    dataset = services.dataset_register(path=chats)
    cpu_worker(probe_queues=False)  # takes cpu and gpu: the transformers backend on one device
    return target, dataset


def test_the_same_settings_return_the_same_job_and_other_settings_another(world, user):
    target, dataset = world
    settings = RegenerationSettings(backend="transformers", max_new_tokens=64)
    first, queued = dataset_regenerate_request(dataset=dataset, target=target, settings=settings, user=user)
    assert queued and first.status == StageStatus.QUEUED and first.backend == "transformers"
    assert Path(first.output_path).parent == Path(dataset.path).parent / "regenerated"
    # Named for people (the source, the target, greedy, the job's number), not a hash of its settings.
    assert Path(first.output_path).name == f"{Path(dataset.path).stem}.{target.name}.greedy.regeneration-{first.pk}.jsonl"
    again, queued_again = dataset_regenerate_request(dataset=dataset, target=target, settings=settings, user=user)
    assert again.pk == first.pk and not queued_again
    hotter, _ = dataset_regenerate_request(dataset=dataset, target=target, user=user,
                                           settings=RegenerationSettings(backend="transformers", max_new_tokens=64,
                                                                         temperature=0.7, seed=3))
    assert hotter.pk != first.pk and hotter.output_path != first.output_path
    # Curation changed: the conversations to answer changed, so the output is another one.
    DatasetSample.objects.create(dataset=dataset, sample_id="c2", line=2, num_turns=2, num_chars=10, excluded=True)
    curated, _ = dataset_regenerate_request(dataset=dataset, target=target, settings=settings, user=user)
    assert curated.pk not in (first.pk, hotter.pk) and curated.exclusions["ids"] == ["c2"]
    assert curated.excluded_count == 1


def test_shards_split_the_same_job_and_the_last_asked_applies(world, user):
    """Shards say who writes the file, not what it holds (issue 36): the same job and file, its split updated."""
    target, dataset = world
    settings = RegenerationSettings(backend="transformers", max_new_tokens=64)
    first, _ = dataset_regenerate_request(dataset=dataset, target=target, settings=settings, user=user)
    assert first.shards is None
    split, _ = dataset_regenerate_request(dataset=dataset, target=target, user=user,
                                          settings=RegenerationSettings(backend="transformers", max_new_tokens=64,
                                                                        shards=3))
    assert split.pk == first.pk and split.output_path == first.output_path
    assert DatasetRegeneration.objects.get(pk=first.pk).shards == 3


def test_a_failed_or_cancelled_job_is_queued_again_on_its_own_file(world, user):
    target, dataset = world
    settings = RegenerationSettings(backend="transformers", max_new_tokens=32)
    job, _ = dataset_regenerate_request(dataset=dataset, target=target, settings=settings, user=user)
    assert regeneration_cancel(job=job, user=user)
    job.refresh_from_db()
    assert job.status == StageStatus.CANCELLED and "cancelled by launcher" in job.error
    assert not regeneration_cancel(job=job, user=user)  # finished already
    assert regeneration_retry(job=job, user=user)
    job.refresh_from_db()
    assert job.status == StageStatus.QUEUED and job.error == ""
    DatasetRegeneration.objects.filter(pk=job.pk).update(status=StageStatus.FAILED, error="vllm serve died")
    again, queued = dataset_regenerate_request(dataset=dataset, target=target, settings=settings, user=user)
    assert again.pk == job.pk and queued and again.status == StageStatus.QUEUED
    assert not regeneration_retry(job=again, user=user)  # queued: nothing to retry
    assert PendingEnqueue.objects.filter(kind="regenerate", object_id=job.pk).exists()


@pytest.mark.parametrize("field, value, words", [
    ("temperature", -0.5, "temperature must be a number from 0"),
    ("temperature", float("nan"), "temperature must be a number from 0"),
    ("max_new_tokens", 0, "max_new_tokens must be a whole number from 1"),
    ("max_samples", 0, "max_samples must be a whole number of at least 1"),
    ("seed", -1, "seed must be a whole number from 0"),
    ("backend", "tgi", "backend must be one of auto, vllm, transformers"),
    ("shards", 0, "shards must be a whole number from 1 to 1024"),
    ("shards", -2, "shards must be a whole number from 1 to 1024"),
    ("shards", 1025, "shards must be a whole number from 1 to 1024"),
])
def test_bad_settings_are_refused_naming_the_field_and_nothing_is_stored(world, user, field, value, words):
    target, dataset = world
    settings = RegenerationSettings(**{"backend": "transformers", field: value})
    with pytest.raises(RegenerationRequestError, match=words) as caught:
        dataset_regenerate_request(dataset=dataset, target=target, settings=settings, user=user)
    assert caught.value.field == field
    assert not DatasetRegeneration.objects.exists()


@pytest.mark.parametrize("kwargs, words", [
    ({"template": None}, "has no chat template"),
    ({"template": ""}, "has no chat template"),
    ({"tokenizer": False}, "has no tokenizer"),
])
def test_a_target_that_cannot_chat_is_refused_before_any_worker(world, user, tmp_path, kwargs, words):
    _, dataset = world
    target = services.target_register(path=_target(tmp_path, "base-model", **kwargs))
    with pytest.raises(RegenerationRequestError, match=words) as caught:
        dataset_regenerate_request(dataset=dataset, target=target, user=user,
                                   settings=RegenerationSettings(backend="transformers"))
    assert caught.value.field == "target"
    assert not DatasetRegeneration.objects.exists()


def test_no_worker_for_the_backend_is_refused_naming_its_queue(world, user):
    target, dataset = world
    with pytest.raises(RegenerationRequestError, match=r"no live worker takes vllm\.2") as caught:
        dataset_regenerate_request(dataset=dataset, target=target, user=user,
                                   settings=RegenerationSettings(backend="vllm", tensor_parallel_size=2))
    assert caught.value.field == "backend"
    # auto takes the backend a live worker runs: this one takes gpu (transformers on one device), not vllm.1
    job, _ = dataset_regenerate_request(dataset=dataset, target=target, user=user,
                                        settings=RegenerationSettings(backend="auto"))
    assert job.backend == "transformers"


def test_lineage_in_the_launch_list_the_run_summary_and_the_comparison(world, user, tmp_path):
    from runs.data.regeneration import regeneration_record
    from runs.pipeline import selectors
    from runs.pipeline.status.run_summary import run_summary
    from runs.pipeline.lifecycle.stage_services import stage_start
    from runs.tracking.comparison import run_settings
    from workers.stages.regenerate.base import RegenerateResult

    target, dataset = world
    job, _ = dataset_regenerate_request(dataset=dataset, target=target, user=user,
                                        settings=RegenerationSettings(backend="transformers", max_new_tokens=16))
    # The file a worker would have written: the recorder registers what is on disk.
    out = Path(job.output_path)
    out.parent.mkdir(parents=True)
    out.write_text(Path(dataset.path).read_text())
    stage_start(stage_name="regenerate", record_id=job.pk, worker="test")

    result = RegenerateResult(
        out_path=str(out), source_sha256="ab" * 32, backend="transformers", backend_version="5.19.0", conversations=5,
        turns_regenerated=5, replies_cut=1, failures=0, failure_examples=[], skipped_excluded=0, resumed_from=0,
        generated_tokens=80, seconds=2.0, tokens_per_s=40.0)
    made = regeneration_record(record_id=job.pk, result=result, log_tail="")
    job.refresh_from_db()
    assert job.status == StageStatus.SUCCEEDED and job.dataset_id == made.pk and job.replies_cut == 1
    labels = [o.label for o in dataset_options()]
    assert labels.index(dataset.name) + 1 == labels.index(f"↳ {made.name} (on-policy for {target.name})")
    # The launch form says a chosen dataset's lineage under its field (the list hides behind a prefilled path).
    lineages = {o.dataset.pk: o.lineage for o in dataset_options()}
    assert lineages[dataset.pk] == ""
    assert lineages[made.pk] == (f"Replies regenerated by {target.name} (transformers, greedy, at most 16 new tokens) "
                                 f"from {dataset.name}: regeneration #{job.pk}")

    on = services.run_launch(user=user, target_path=target.path, dataset_path=made.path,
                             config=RunConfig(draft_vocab_size=64), enqueue=False)
    off = services.run_launch(user=user, target_path=target.path, dataset_path=dataset.path,
                              config=RunConfig(draft_vocab_size=64), enqueue=False)
    assert run_data_policy(run=on).on_policy and not run_data_policy(run=off).on_policy
    summary = run_summary(selectors.run_list().get(pk=on.pk))
    assert summary["dataset"]["on_policy"] is True
    assert summary["regenerated_from"]["dataset_id"] == dataset.pk
    assert summary["regenerated_from"]["content_sha256"] == "ab" * 32
    assert run_summary(selectors.run_list().get(pk=off.pk))["regenerated_from"] is None
    assert run_settings(on)["data"].startswith("on-policy") and run_settings(off)["data"].startswith("off-policy")
    client = Client()
    client.force_login(user)
    on_page, off_page = (client.get(f"/runs/{r.pk}/").content.decode() for r in (on, off))
    assert "on-policy: replies regenerated by this run&#x27;s target" in on_page
    assert "off-policy: replies as the file holds them" in off_page and "regenerate it with the target" in off_page
    made_page = client.get(f"/datasets/{made.pk}/").content.decode()
    assert f"Made from <a href=\"/datasets/{dataset.pk}/\">" in made_page and "1 reply stopped at 16 tokens" in made_page
    assert made.name in client.get(f"/datasets/{dataset.pk}/").content.decode()
    # Asking again with the same settings returns the dataset it made, queuing nothing.
    again, queued = dataset_regenerate_request(dataset=dataset, target=target, user=user,
                                               settings=RegenerationSettings(backend="transformers", max_new_tokens=16))
    assert again.pk == job.pk and not queued and again.dataset_id == made.pk
