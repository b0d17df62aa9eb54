"""A GPU backend that loads the target is launched only where a live worker taking its queue has GPUs
whose memory holds the target's weights (with 10% to spare); the estimate comes from the weight files
(or their index) and is skipped for a target without them. The defaults on one device and training
are not judged by the target's size."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from runs.pipeline import services
from runs.models import PendingEnqueue, PipelineRun, TargetModel
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from tests.helpers.fleet import cpu_worker, fake_gpu_worker
from workers.contract.host import backends
from workers.contract.target import target_weight_bytes

pytestmark = pytest.mark.django_db

WEIGHTS = 140_000_000_000  # a 70B target in bf16


def _index(target, total_size) -> None:
    """FAKE: the index a sharded checkpoint carries (the shards themselves are not needed to size it)."""
    (target / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total_size}, "weight_map": {"lm_head.weight": "model-00001-of-00030.safetensors"}}))


def _launch(user, roots, **config) -> PipelineRun:
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64, **config))


def _refused(user, roots, **config) -> str:
    before = (PipelineRun.objects.count(), PendingEnqueue.objects.count(), TargetModel.objects.count())
    with pytest.raises(RunConfigError) as caught:
        _launch(user, roots, **config)
    assert caught.value.field == "tensor_parallel_size", str(caught.value)
    assert (PipelineRun.objects.count(), PendingEnqueue.objects.count(), TargetModel.objects.count()) == before
    return str(caught.value)


def test_weights_are_sized_from_the_index_or_the_files_and_not_guessed_without_them(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    assert target_weight_bytes(target) is None  # config only
    (target / "pytorch_model.bin").write_bytes(b"\0" * 700)
    assert target_weight_bytes(target) == 700
    (target / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 1000)
    (target / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 24)
    assert target_weight_bytes(target) == 1024  # safetensors, when there are any, not the .bin beside them
    _index(target, 999_999)
    assert target_weight_bytes(target) == 999_999  # the index's total: the tensors without the files' headers
    (target / "model.safetensors.index.json").write_text('{"metadata": {"total_size": "big"}}')
    assert target_weight_bytes(target) == 1024
    (target / "model.safetensors.index.json").write_text("not json")
    assert target_weight_bytes(target) == 1024


def test_vllm_is_refused_on_gpus_too_small_for_the_target_naming_sizes_and_the_best_worker(user, roots):
    cpu_worker("cpu@this-host")
    small = fake_gpu_worker("small@fake-gpu-host", gpus=2)  # FAKE: two 24 GB GPUs
    small.capabilities["gpus"] = [{"name": "FAKE L4", "memory_bytes": 24_000_000_000}] * 2
    small.save(update_fields=["capabilities"])
    fake_gpu_worker("big@fake-gpu-host", gpus=8)  # FAKE: eight 80 GiB GPUs (85.9 GB each)
    _index(roots / "target", WEIGHTS)
    message = _refused(user, roots, extraction_backend="vllm", tensor_parallel_size=1)
    assert message == ("tensor_parallel_size 1: the target's weights take 140.0 GB, more than 90% of the memory of "
                       "vLLM on 1 GPU: the best live worker that takes vllm.1, big@fake-gpu-host, has 85.9 GB on 1 GPU")
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)  # 171.8 GB: it fits
    assert run.config["tensor_parallel_size"] == 2


def test_the_defaults_on_one_device_and_training_are_not_judged_by_the_targets_size(user, roots):
    cpu_worker("cpu@this-host")  # no GPU at all: the defaults run on its CPU
    fake_gpu_worker("big@fake-gpu-host", gpus=8)  # FAKE: eight 80 GiB GPUs
    _index(roots / "target", 160_000_000_000)
    assert _launch(user, roots).config["extraction_backend"] == "transformers"
    # speculators' trainer reads only the verifier's embeddings and lm_head, not the whole target.
    assert _launch(user, roots, training_backend="speculators", train_gpus=1).config["train_gpus"] == 1
    # Transformers spread over several GPUs loads the whole target there: judged like vLLM.
    assert _refused(user, roots, tensor_parallel_size=2) == (
        "tensor_parallel_size 2: the target's weights take 160.0 GB, more than 90% of the memory of Transformers on "
        "2 GPUs: the best live worker that takes transformers.2, big@fake-gpu-host, has 171.8 GB on 2 GPUs")
    assert _launch(user, roots, tensor_parallel_size=4).config["tensor_parallel_size"] == 4


def test_an_inline_launch_checks_this_hosts_gpus(user, roots, monkeypatch):
    # FAKE probe and GPUs: this host runs vLLM on two 24 GB GPUs.
    monkeypatch.setitem(backends.BACKENDS_BY_NAME, "vllm", replace(backends.BACKENDS_BY_NAME["vllm"],
                                                                   check=lambda gpus, have: None))
    monkeypatch.setattr(backends, "detect_gpus", lambda: (backends.Gpu("FAKE L4", 24_000_000_000),) * 2)
    monkeypatch.setattr(backends, "vllm_description", lambda: {"executable": "vllm", "version": "0.33.0", "build": "cuda"})
    _index(roots / "target", 30_000_000_000)
    launch = dict(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl", enqueue=False,
                  check="this_host")
    with pytest.raises(RunConfigError, match=r"^tensor_parallel_size 1: the target's weights take 30.0 GB, more than "
                                             r"90% of the memory of vLLM on 1 GPU: this host \(.+\) has 24.0 GB on 1 GPU$"):
        services.run_launch(config=RunConfig(draft_vocab_size=64, extraction_backend="vllm"), **launch)
    run = services.run_launch(config=RunConfig(draft_vocab_size=64, extraction_backend="vllm", tensor_parallel_size=2),
                              **launch)
    assert run.config["tensor_parallel_size"] == 2


def test_the_launch_forms_target_info_gives_the_weights_size(client, user, roots):
    client.force_login(user)
    info = client.get("/api/v1/targets/inspect/", {"path": str(roots / "target")}).json()
    assert info["weight_bytes"] is None  # config only: nothing to say
    _index(roots / "target", WEIGHTS)
    assert client.get("/api/v1/targets/inspect/", {"path": str(roots / "target")}).json()["weight_bytes"] == WEIGHTS


def test_a_retry_is_judged_by_the_same_rule_against_the_workers_live_now(user, roots):
    from runs.fleet.services import worker_stopped

    cpu_worker("cpu@this-host")
    fake_gpu_worker("big@fake-gpu-host", gpus=8)  # FAKE
    _index(roots / "target", WEIGHTS)
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    services.run_cancel(run=run, user=user)
    worker_stopped(name="big@fake-gpu-host")
    small = fake_gpu_worker("small@fake-gpu-host", gpus=2)  # FAKE: takes vllm.2, on two 24 GB GPUs
    small.capabilities["gpus"] = [{"name": "FAKE L4", "memory_bytes": 24_000_000_000}] * 2
    small.save(update_fields=["capabilities"])
    with pytest.raises(RunConfigError, match="weights take 140.0 GB, more than 90% of the memory of vLLM on 2 GPUs: "
                                             "the best live worker that takes vllm.2, small@fake-gpu-host, has 48.0 GB"):
        services.run_retry(run=run, user=user)
