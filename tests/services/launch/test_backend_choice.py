"""A run's extraction and training backends and GPU counts, checked the same way from the form, the
CLI and the service against what the live workers can run: a choice nobody can run is refused
naming the field and stores nothing; the defaults always launch, with or without live workers."""
from __future__ import annotations

import io
import json
from datetime import timedelta

import re

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from runs.pipeline import services
from runs.fleet.models import Worker
from runs.models import PendingEnqueue, PipelineRun, StageStatus
from runs.pipeline.dispatch.routing import stage_queue
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from tests.helpers.fleet import (
    cpu_host_capabilities,
    cpu_worker,
    fake_gpu_host_capabilities,
    fake_gpu_worker,
    this_host_capabilities,
)
from workers.contract.host.backends import host_queues

pytestmark = pytest.mark.django_db


def _launch(user, roots, **config):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64, **config))


def _refused(user, roots, field: str, **config) -> str:
    before = (PipelineRun.objects.count(), PendingEnqueue.objects.count())
    with pytest.raises(RunConfigError) as caught:
        _launch(user, roots, **config)
    assert caught.value.field == field and str(caught.value).startswith(field), str(caught.value)
    assert (PipelineRun.objects.count(), PendingEnqueue.objects.count()) == before
    return str(caught.value)


@pytest.mark.parametrize(("config", "field"), [
    ({"extraction_backend": "tensorrt"}, "extraction_backend"),
    ({"training_backend": ""}, "training_backend"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"tensor_parallel_size": 65}, "tensor_parallel_size"),
    ({"tensor_parallel_size": "2"}, "tensor_parallel_size"),
    ({"train_gpus": 2}, "train_gpus"),  # eagle3web's loop trains on one device
    ({"train_gpus": None, "training_backend": "speculators"}, "train_gpus"),
])
def test_run_config_names_the_bad_backend_setting(config, field):
    with pytest.raises(RunConfigError) as caught:
        RunConfig(**config)
    assert caught.value.field == field and field in str(caught.value)


def test_defaults_launch_with_no_worker_live_but_nothing_else_does(user, roots):
    run = _launch(user, roots)
    assert (run.config["extraction_backend"], run.config["tensor_parallel_size"]) == ("transformers", 1)
    assert (run.config["training_backend"], run.config["train_gpus"]) == ("eagle3web", 1)
    assert "no worker is live" in _refused(user, roots, "extraction_backend", extraction_backend="vllm")
    assert "no worker is live" in _refused(user, roots, "tensor_parallel_size", tensor_parallel_size=2)
    assert "no worker is live" in _refused(user, roots, "training_backend", training_backend="speculators")


def test_a_cpu_fleet_refuses_speculators_and_several_gpus_and_takes_vllm_only_where_its_cpu_build_is(user, roots):
    cpu_worker("cpu@this-host")
    why_vllm = cpu_host_capabilities()["backends"]["vllm"]
    if why_vllm is None:  # `make vllm` ran here: its CPU build extracts on this host's CPU (vllm.1)
        assert _launch(user, roots, extraction_backend="vllm").config["extraction_backend"] == "vllm"
        message = _refused(user, roots, "tensor_parallel_size", extraction_backend="vllm", tensor_parallel_size=2)
        assert "no live worker that runs vLLM has a GPU: it runs on the CPU" in message
    else:
        message = _refused(user, roots, "extraction_backend", extraction_backend="vllm")
        assert f"no live worker has vLLM ({why_vllm})" in message
    message = _refused(user, roots, "training_backend", training_backend="speculators")
    assert "needs a GPU; this host has none" in message
    message = _refused(user, roots, "tensor_parallel_size", tensor_parallel_size=2)
    assert "has a GPU: it runs on the CPU" in message
    assert _launch(user, roots).config["extraction_backend"] == "transformers"


def test_a_live_gpu_worker_makes_its_backends_and_gpu_counts_launchable(user, roots):
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=8)  # FAKE: an 8-GPU host with vLLM and speculators
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=8, training_backend="speculators",
                  train_gpus=4)
    assert {k: run.config[k] for k in ("extraction_backend", "tensor_parallel_size", "training_backend",
                                       "train_gpus")} == {"extraction_backend": "vllm", "tensor_parallel_size": 8,
                                                          "training_backend": "speculators", "train_gpus": 4}
    message = _refused(user, roots, "tensor_parallel_size", extraction_backend="vllm", tensor_parallel_size=9)
    assert "the largest live worker for vLLM (fake-gpu@fake-gpu-host) runs it on 8 GPUs" in message
    assert "needs 9 GPUs; this host has 8" in message
    # Once it stops heartbeating, what only it could run is refused again.
    Worker.objects.update(last_seen=timezone.now() - timedelta(minutes=10))
    _refused(user, roots, "extraction_backend", extraction_backend="vllm")


def test_a_worker_counts_only_for_the_queues_it_takes_not_for_what_it_could_run(client, user, roots):
    # FAKE: an 8-GPU host with vLLM and speculators, started with EAGLE3WEB_WORKER_GPU_QUEUES=0 -Q vllm.1,vllm.2.
    fake_gpu_worker("vllm-only@fake-gpu-host", gpus=8, queues=["vllm.1", "vllm.2"])
    message = _refused(user, roots, "training_backend", extraction_backend="vllm", tensor_parallel_size=2,
                       training_backend="speculators", train_gpus=4)
    assert ("no live worker takes a queue of speculators' trainer (torchrun): vllm-only@fake-gpu-host could run it "
            "but takes only vllm.1, vllm.2") in message
    message = _refused(user, roots, "tensor_parallel_size", extraction_backend="vllm", tensor_parallel_size=4)
    assert "the largest live worker for vLLM (vllm-only@fake-gpu-host) runs it on 2 GPUs: it does not take vllm.3" \
        in message
    # Nobody takes "gpu" either: the defaults' stages would wait there for ever.
    message = _refused(user, roots, "extraction_backend")
    assert "no live worker takes a queue of Transformers" in message
    cpu_worker("gpu-only@this-host", queues=("gpu",))
    # On one GPU: measuring acceptance then goes to gpu (on 2 it would need transformers.2, which nobody takes).
    with pytest.raises(RunConfigError, match="^the prepare dataset stage goes to queue cpu, which no live worker "
                                             "takes \\(they take gpu, vllm.1, vllm.2\\)$"):
        _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=1)
    cpu_worker("cpu@this-host", queues=("cpu", "gpu"))
    assert _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=1).config["tensor_parallel_size"] == 1
    _refused(user, roots, "training_backend", training_backend="speculators", train_gpus=4)

    client.force_login(user)
    page = client.get("/runs/new/").content.decode()
    assert '<option value="vllm">vLLM</option>' in page and "Live workers: Transformers up to 1 GPU; vLLM up to 2 GPUs." in page
    assert '<option value="speculators" disabled>' in page and \
        "(not available: no live worker takes a queue of speculators&#x27; trainer" in page
    options = client.get("/api/v1/workers/").json()["launch_options"]
    assert options["vllm"]["gpu_counts"] == [1, 2] and not options["speculators"]["available"]


def test_a_gpu_count_no_live_worker_takes_is_refused_even_below_the_largest(client, user, roots):
    cpu_worker("cpu@this-host", queues=("cpu", "gpu"), probe_queues=False)
    # FAKE: -Q vllm.2,transformers.2 (measuring acceptance loads the target with Transformers on 2 GPUs)
    fake_gpu_worker("tp2@fake-gpu-host", gpus=2, queues=["vllm.2", "transformers.2"])
    message = _refused(user, roots, "tensor_parallel_size", extraction_backend="vllm", tensor_parallel_size=1)
    assert "no live worker takes vllm.1 (vLLM on 1 GPU); live workers take vLLM on 2 GPU(s)" in message
    assert _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2).pk
    client.force_login(user)
    option = client.get("/workers/").content.decode().split('data-option="vllm"')[1].split("</tr>")[0]
    assert "on 2 GPUs" in option and "up to" not in option


def test_transformers_on_several_gpus_needs_accelerate_on_the_worker(user, roots):
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=4, accelerate=False)  # FAKE: 4 GPUs, no accelerate
    message = _refused(user, roots, "tensor_parallel_size", tensor_parallel_size=2)
    assert "needs accelerate" in message
    # vLLM extracts on 4 GPUs there, but measuring acceptance spreads the target with Transformers.
    message = _refused(user, roots, "tensor_parallel_size", extraction_backend="vllm", tensor_parallel_size=4)
    assert "measuring acceptance loads the target with Transformers on 4 GPUs" in message and "needs accelerate" in message
    assert _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=1).pk


def test_form_offers_only_what_live_workers_run_and_refuses_the_rest_with_a_400(client, user, roots):
    # Started with EAGLE3WEB_WORKER_GPU_QUEUES=0 -Q cpu,gpu: no vLLM queue, whether vLLM is here or not.
    cpu_worker("cpu@this-host", probe_queues=False)
    why = ("no live worker has vLLM" if cpu_host_capabilities()["backends"]["vllm"]
           else "no live worker takes a queue of vLLM")
    client.force_login(user)
    page = client.get("/runs/new/").content.decode()
    assert f'<option value="vllm" disabled>vLLM (not available: {why}' in page
    assert '<option value="transformers" selected>Transformers</option>' in page
    assert f"Live workers: Transformers up to 1 GPU; vLLM: {why}" in page
    form = {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "max_seq_len": 512,
            "draft_vocab_size": 64, "epochs": 1, "lr": 0.0003, "ttt_steps": 3}
    response = client.post("/runs/new/", {**form, "extraction_backend": "vllm"})
    assert response.status_code == 400 and PipelineRun.objects.count() == 0
    field = response.content.decode().split('for="id_extraction_backend"')[1].split('for="id_tensor_parallel_size"')[0]
    assert f'<div class="field-error">extraction_backend vllm: {why}' in field  # at its field
    response = client.post("/runs/new/", {**form, "train_gpus": 3})
    assert response.status_code == 400 and "train_gpus must be 1 with training_backend eagle3web" in \
        response.content.decode() and PipelineRun.objects.count() == 0
    response = client.post("/runs/new/", {**form, "training_backend": "deepspeed"})
    assert response.status_code == 400 and "Select a valid choice" in response.content.decode()

    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)
    assert '<option value="vllm">vLLM</option>' in client.get("/runs/new/").content.decode()
    response = client.post("/runs/new/", {**form, "extraction_backend": "vllm", "tensor_parallel_size": 2})
    run = PipelineRun.objects.get()
    assert response.status_code == 302 and run.config["extraction_backend"] == "vllm"
    api = client.get(f"/api/v1/runs/{run.pk}/status/").json()
    assert api["backends"] == [
        {"stage": "extract", "backend": "vllm", "label": "vLLM", "gpus": 2, "default": False, "device": None},
        {"stage": "train", "backend": "eagle3web", "label": "eagle3web's training loop", "gpus": 1, "default": True,
         "device": None}]  # where each ran, once it did (none has yet)
    assert "<strong>vLLM</strong> on 2 GPUs" in client.get(f"/runs/{run.pk}/").content.decode()


def test_cli_takes_the_backend_options_and_refuses_naming_the_field(user, roots):
    common = ["--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"), "--draft-vocab-size", "64",
              "--user", user.username]
    with pytest.raises(CommandError, match="^extraction_backend vllm: no worker is live"):
        call_command("run_pipeline", *common, "--extraction-backend", "vllm")
    with pytest.raises(CommandError, match="^train_gpus must be 1 with training_backend eagle3web"):
        call_command("run_pipeline", *common, "--train-gpus", "2")
    assert PipelineRun.objects.count() == 0
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=8)
    out = io.StringIO()
    call_command("run_pipeline", *common, "--training-backend", "speculators", "--train-gpus", "8", "--json", stdout=out)
    summary = json.loads(out.getvalue())
    assert summary["config"]["training_backend"] == "speculators" and summary["backends"][1]["gpus"] == 8


def test_cli_inline_checks_this_host_not_the_fleet(user, roots):
    common = ["--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"), "--draft-vocab-size", "64",
              "--user", user.username, "--inline"]
    caps = this_host_capabilities()
    why = caps["backends"]["vllm"]
    # A remote vLLM worker is live, but --inline runs extraction in this process, on this host.
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=8)  # FAKE
    if why:
        with pytest.raises(CommandError, match=r"^extraction_backend vllm: vLLM \(vllm\) on 1 GPU\(s\) cannot run on "
                                               rf".*: {re.escape(why)}$"):
            call_command("run_pipeline", *common, "--extraction-backend", "vllm")
    elif caps["vllm"]["build"] == "cpu":
        with pytest.raises(CommandError, match=r"^tensor_parallel_size 8: vLLM \(vllm\) on 8 GPU\(s\) cannot run on "
                                               r".*: vLLM's CPU build \(.*\) runs on the CPU, not on 8 GPUs$"):
            call_command("run_pipeline", *common, "--extraction-backend", "vllm", "--tensor-parallel-size", "8")
    if not caps["gpus"]:  # what a GPU host runs, it is not refused
        with pytest.raises(CommandError, match=r"^tensor_parallel_size 2: Transformers \(transformers\) on 2 GPU\(s\) "
                                               r"cannot run on .*: needs a GPU; this host has none$"):
            call_command("run_pipeline", *common, "--tensor-parallel-size", "2")
    assert PipelineRun.objects.count() == 0


def test_an_inline_launch_is_accepted_by_this_hosts_probe_whatever_the_fleet(user, roots, monkeypatch):
    from dataclasses import replace

    from workers.contract.host import backends

    # FAKE probe: this host runs vLLM (as a vLLM box would); no Celery worker is live anywhere.
    monkeypatch.setitem(backends.BACKENDS_BY_NAME, "vllm", replace(backends.BACKENDS_BY_NAME["vllm"],
                                                                   check=lambda gpus, have: None))
    _refused(user, roots, "extraction_backend", extraction_backend="vllm")  # the fleet cannot run it
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64, extraction_backend="vllm"), enqueue=False,
                              check="this_host")
    assert run.config["extraction_backend"] == "vllm" and not PendingEnqueue.objects.filter(
        kind=PendingEnqueue.Kind.PIPELINE, object_id=run.pk).exists()
    # A fleet that takes no default queue does not stop an inline run on the defaults either.
    fake_gpu_worker("vllm-only@fake-gpu-host", queues=["vllm.1"])  # FAKE
    assert services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64), enqueue=False, check="this_host").pk
    with pytest.raises(ValueError, match="check must be 'fleet' or 'this_host', got 'nowhere'"):
        services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                            config=RunConfig(draft_vocab_size=64), check="nowhere")


def test_each_choice_goes_to_the_queue_only_fitting_workers_take():
    assert stage_queue(stage_name="extract", config={}) == "gpu"  # runs from before backends: the defaults
    assert stage_queue(stage_name="extract", config={"extraction_backend": "transformers"}) == "gpu"
    assert stage_queue(stage_name="extract", config={"tensor_parallel_size": 4}) == "transformers.4"
    assert stage_queue(stage_name="extract", config={"extraction_backend": "vllm", "tensor_parallel_size": 2}) \
        == "vllm.2"
    assert stage_queue(stage_name="train", config={"training_backend": "speculators", "train_gpus": 8}) \
        == "speculators.8"
    assert [stage_queue(stage_name=s, config={"extraction_backend": "vllm"}) for s in ("prepare", "vocab", "evaluate")] \
        == ["cpu", "cpu", "gpu"]
    # FAKE 2-GPU host: it takes vLLM on 1 or 2 GPUs, never on 4.
    two = host_queues(fake_gpu_host_capabilities(gpus=2))
    assert two == ["gpu", "transformers.2", "vllm.1", "vllm.2", "speculators.1", "speculators.2"]
    assert host_queues(fake_gpu_host_capabilities(gpus=2, vllm=False, accelerate=False)) == [
        "gpu", "speculators.1", "speculators.2"]
    # A host without GPUs adds no GPU queue; with vLLM's CPU build (`make vllm`) it adds vllm.1.
    here = cpu_host_capabilities()
    assert host_queues(here) == ([] if here["backends"]["vllm"] else ["vllm.1"])


def test_a_misrouted_stage_fails_at_start_naming_the_backend_and_why(user, roots):
    from workers.orchestration.tasks import stage_execute

    from workers.contract.host.backends import BACKENDS_BY_NAME

    # FAKE: lets the launch through; this host has no vLLM, or only its CPU build, or fewer than 8 GPUs
    fake_gpu_worker("fake-gpu@fake-gpu-host")
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=8)
    why = BACKENDS_BY_NAME["vllm"].probe(8)
    if why is None:
        pytest.skip("this host runs vLLM on 8 GPUs: nothing is misrouted to it")
    assert stage_execute(stage_name="extract", record_id=run.extract_stage.pk, worker="cpu@this-host") is False
    run.extract_stage.refresh_from_db()
    assert run.extract_stage.status == StageStatus.FAILED
    assert run.extract_stage.error.startswith("The extraction reached a worker that cannot run its backend: vLLM (vllm) "
                                              "on 8 GPU(s) cannot run on")
    assert (run.extract_stage.failure_kind, run.extract_stage.failure_field) == ("transient", "extraction_backend")
    assert why in run.extract_stage.error


def test_a_copy_of_a_run_whose_backend_is_gone_keeps_it_selected_and_is_refused_saying_why(client, user, roots):
    """A disabled <option> is not submitted by browsers: a copied run's vLLM must not turn into the default."""
    worker = fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)  # FAKE GPU host, live at first
    client.force_login(user)
    form = {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "max_seq_len": 512,
            "draft_vocab_size": 64, "epochs": 1, "lr": 0.0003, "ttt_steps": 3}
    assert client.post("/runs/new/", {**form, "extraction_backend": "vllm", "tensor_parallel_size": 2}).status_code == 302
    run = PipelineRun.objects.get()
    worker.delete()  # the GPU host left the fleet
    cpu_worker("cpu@this-host", probe_queues=False)
    why = ("no live worker has vLLM" if cpu_host_capabilities()["backends"]["vllm"]
           else "no live worker takes a queue of vLLM")
    page = client.get(f"/runs/new/?copy={run.pk}").content.decode()
    assert f'<option value="vllm" selected>vLLM (not available: {why}' in page
    response = client.post("/runs/new/", {**form, "extraction_backend": "vllm", "tensor_parallel_size": 2})
    assert response.status_code == 400 and f"extraction_backend vllm: {why}" in response.content.decode()
    assert PipelineRun.objects.count() == 1
