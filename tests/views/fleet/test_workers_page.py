"""The workers page: each worker busy (with which run and stage, since when), idle or offline (last
seen), its GPUs and backends; the queue in order, with the queue each stage goes to and who takes it."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.pipeline import services
from runs.fleet.models import Worker
from runs.fleet.services import worker_heartbeat, worker_stopped
from runs.models import PendingEnqueue, StageStatus
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stage_services import stage_start
from tests.helpers.fleet import cpu_worker, fake_gpu_worker

pytestmark = pytest.mark.django_db


def _launch(user, roots, name="", **config):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64, **config), name=name)


def _rows(html: str, attribute: str) -> list[str]:
    return re.findall(rf'<tr {attribute}="([^"]*)"', html)


def _page(client, user) -> str:
    client.force_login(user)
    response = client.get("/workers/")
    assert response.status_code == 200
    return response.content.decode()


def test_page_shows_busy_idle_and_offline_workers_with_their_gpus_and_backends(client, user, roots):
    fake_gpu_worker("fake-gpu@fake-gpu-host")
    cpu_worker("cpu@this-host")
    cpu_worker("lost@old-host")
    Worker.objects.filter(name="lost@old-host").update(last_seen=timezone.now() - timedelta(hours=2))
    cpu_worker("stopped@old-host")
    worker_stopped(name="stopped@old-host")
    run = _launch(user, roots, name="busy-run")
    stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="cpu@this-host")

    html = _page(client, user)
    statuses = dict(re.findall(r'<tr data-worker="([^"]+)" data-status="(\w+)"', html))
    assert statuses == {"cpu@this-host": "busy", "fake-gpu@fake-gpu-host": "idle", "lost@old-host": "offline",
                        "stopped@old-host": "offline"}
    assert list(statuses) == ["cpu@this-host", "fake-gpu@fake-gpu-host", "lost@old-host", "stopped@old-host"]
    busy = html.split('data-worker="cpu@this-host"')[1].split("</tr>")[0]
    assert f'href="/runs/{run.pk}/"' in busy and "busy-run" in busy and "prepare dataset" in busy and "since" in busy
    assert "none (CPU)" in busy  # this host: no GPU
    # vLLM: why not, or where `make vllm` installed its CPU build: on the CPU, version and build shown.
    vllm = Worker.objects.get(name="cpu@this-host").capabilities["vllm"]
    if vllm is None:
        assert "vLLM: " in busy
    else:
        assert 'vLLM <span class="hint">on the CPU' in busy and f"({vllm['build']} build, {vllm['executable']})" in busy
    gpu = html.split('data-worker="fake-gpu@fake-gpu-host"')[1].split("</tr>")[0]
    assert "8 × NVIDIA H100 80GB HBM3" in gpu and "80.0\xa0GB each" in gpu
    assert "up to 8 GPUs" in gpu and "vllm.8" in gpu
    lost = html.split('data-worker="lost@old-host"')[1].split("</tr>")[0]
    assert "last seen" in lost and "2\xa0hours ago" in lost
    assert "stopped" in html.split('data-worker="stopped@old-host"')[1].split("</tr>")[0]


def test_queue_lists_waiting_work_in_order_with_its_queue_and_who_takes_it(client, user, roots):
    fake_gpu_worker("fake-gpu@fake-gpu-host")
    cpu_worker("cpu@this-host", queues=("cpu", "gpu"))
    first = _launch(user, roots)
    second = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    third = _launch(user, roots, training_backend="speculators", train_gpus=4)
    stage_start(stage_name="prepare", record_id=first.preparation.pk, worker="cpu@this-host")
    type(second.preparation).objects.filter(pk=second.preparation.pk).update(status=StageStatus.SUCCEEDED)

    html = _page(client, user)
    queue = html.split('id="queue-table"')[1].split("</table>")[0]
    rows = re.findall(r'<tr data-kind="(\w+)" data-run="(\d*)">\s*<td>(\d+)</td>.*?<code>([^<]+)</code></td>\s*'
                      r'<td>(.*?)</td>', queue, flags=re.S)
    # Jobs outside runs (e.g. the catalogue of the dataset the launches registered) are listed too.
    listed = [(kind, int(run), q, re.sub(r"<[^>]+>", "", state).strip()) for kind, run, _, q, state in rows if run]
    # Ready work first, oldest run first; then what waits behind an earlier stage of its run. Only the
    # head of each queue is next: the dataset's catalogue, queued by the first launch, is ahead in cpu.
    assert [(kind, q) for kind, run, _, q, _ in rows if not run] == [("catalogue", "cpu")]
    # A job links to what it works on.
    assert f'(<a href="/datasets/{first.dataset_id}/">dataset</a>)' in queue
    assert listed[:2] == [
        ("extract", second.pk, "vllm.2", "next for fake-gpu@fake-gpu-host"),
        ("prepare", third.pk, "cpu", "behind 1 in cpu"),
    ]
    waiting = {(kind, run): (q, state) for kind, run, q, state in listed[2:]}
    assert waiting[("extract", first.pk)] == ("gpu", "after its prepare stage")
    assert waiting[("train", third.pk)] == ("speculators.4", "after its prepare stage")
    assert waiting[("vocab", second.pk)] == ("cpu", "after its extract stage")
    assert len(listed) == 2 + 4 + 3 + 4  # first: 4 after prepare; second: 3 after extract; third: 4 after prepare

    # The vLLM worker goes away: its work is still listed, and the page says nobody takes it.
    worker_stopped(name="fake-gpu@fake-gpu-host")
    html = _page(client, user)
    assert re.search(r'<span class="field-error">no live worker takes <code>vllm.2</code></span>', html)

    # A worker busy with a job links to what it works on.
    catalogue = first.dataset.catalogues.get()
    stage_start(stage_name="catalogue", record_id=catalogue.pk, worker="cpu@this-host")
    assert (f'catalogue dataset #{catalogue.pk} (<a href="/datasets/{first.dataset_id}/">dataset</a>)'
            in _page(client, user))


def test_queue_shows_what_the_broker_refused_and_what_waits_for_a_retry(client, user, roots):
    run = _launch(user, roots)
    PendingEnqueue.objects.filter(object_id=run.pk).update(attempts=3, last_error="Error 111 connecting to redis")
    type(run.preparation).objects.filter(pk=run.preparation.pk).update(status=StageStatus.FAILED)

    html = _page(client, user)
    outbox = html.split('id="outbox"')[1].split("</ul>")[0]
    assert f'href="/runs/{run.pk}/"' in outbox and "3 tries" in outbox and "Error 111" in outbox
    assert "4 stages of failed or cancelled runs wait for a retry" in html
    assert f'data-run="{run.pk}"' not in html  # behind a failed stage nothing is queued for a worker


def test_page_runs_as_many_queries_for_twelve_workers_as_for_two(client, user, roots):
    def queries() -> int:
        client.force_login(user)
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/workers/").status_code == 200
        return len(ctx.captured_queries)

    run = _launch(user, roots)
    cpu_worker("cpu-0@this-host")
    fake_gpu_worker("fake-gpu-0@fake-gpu-host")
    stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="cpu-0@this-host")
    few = queries()
    for i in range(1, 6):
        cpu_worker(f"cpu-{i}@this-host")
        fake_gpu_worker(f"fake-gpu-{i}@fake-gpu-host")
    more = _launch(user, roots)
    stage_start(stage_name="prepare", record_id=more.preparation.pk, worker="cpu-3@this-host")
    assert queries() == few


def test_a_restarted_worker_takes_its_row_over_and_is_live_again(client, user):
    started = timezone.now()
    cpu_worker("cpu@this-host")
    worker_stopped(name="cpu@this-host")
    worker_heartbeat(name="cpu@this-host", hostname="this-host", capabilities={"gpus": []}, queues=["cpu"],
                     started_at=started)
    row = Worker.objects.get()
    assert row.stopped_at is None and row.queues == ["cpu"] and row.started_at == started
    assert 'data-status="idle"' in _page(client, user)


def test_page_says_how_to_start_a_worker_when_none_reported(client, user):
    html = _page(client, user)
    assert "No worker has reported yet" in html and "Adding a worker host" in html
    assert 'data-option="transformers"' in html and "no worker is live to run vLLM" in html


def test_api_gives_the_same_facts_as_json(client, user, roots):
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)
    cpu_worker("cpu@this-host")
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="cpu@this-host")
    client.force_login(user)
    fleet = client.get("/api/v1/workers/").json()
    assert [(w["name"], w["status"]) for w in fleet["workers"]] == [("cpu@this-host", "busy"),
                                                                     ("fake-gpu@fake-gpu-host", "idle")]
    assert fleet["workers"][0]["doing"][0]["stage"] == "prepare" and fleet["workers"][0]["doing"][0]["run_id"] == run.pk
    assert len(fleet["workers"][1]["gpus"]) == 2
    assert fleet["launch_options"]["vllm"]["available"] and fleet["launch_options"]["vllm"]["max_gpus"] == 2
    extract = next(i for i in fleet["queue"] if i["kind"] == "extract" and i["run_id"] == run.pk)
    assert extract["queue"] == "vllm.2" and extract["waits_for"] == "prepare"


def test_a_run_whose_config_names_an_unknown_backend_is_listed_not_a_500(client, user, roots):
    cpu_worker("cpu@this-host")
    run = _launch(user, roots)
    broken = {**run.config, "extraction_backend": "vLLM", "train_gpus": "two"}
    type(run).objects.filter(pk=run.pk).update(config=broken)  # as an edit behind the launch checks left it

    html = _page(client, user)
    row = html.split(f'<tr data-kind="extract" data-run="{run.pk}">')[1].split("</tr>")[0]
    assert "unknown backend &#x27;vLLM&#x27; (no worker takes it)" in row and "<code>vLLM.1</code>" in row
    train = html.split(f'<tr data-kind="train" data-run="{run.pk}">')[1].split("</tr>")[0]
    assert "train_gpus &#x27;two&#x27; is not a GPU count from 1 to 64 (no worker takes it)" in train
    client.force_login(user)
    fleet = client.get("/api/v1/workers/").json()
    extract = next(i for i in fleet["queue"] if i["kind"] == "extract" and i["run_id"] == run.pk)
    assert extract["problem"] == "unknown backend 'vLLM'" and extract["taken_by"] == []
    page = client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200 and "<strong>vLLM</strong> on 1 GPU" in page.content.decode()


def _catalogues_done() -> None:
    """The launches' dataset catalogue (a cpu job) out of the way: these tests are about the runs' stages."""
    from runs.pipeline.jobs.models import DatasetCatalogue

    DatasetCatalogue.objects.update(status=StageStatus.SUCCEEDED)


def _ready(html: str) -> list[tuple[str, int, str, str]]:
    """(kind, run, queue, state) of each run's stage listed, in the page's order."""
    queue = html.split('id="queue-table"')[1].split("</table>")[0]
    rows = re.findall(r'<tr data-kind="(\w+)" data-run="(\d+)">\s*<td>\d+</td>.*?<code>([^<]+)</code></td>\s*'
                      r'<td>(.*?)</td>', queue, flags=re.S)
    return [(kind, int(run), q, re.sub(r"<[^>]+>", "", state).strip()) for kind, run, q, state in rows]


def test_each_queue_is_listed_in_launch_order_and_only_its_head_is_next(client, user, roots):
    from runs.pipeline.lifecycle.stage_services import stage_fail, stage_succeed

    cpu_worker("cpu@this-host", queues=("cpu", "gpu"))
    first = _launch(user, roots, name="first")
    second = _launch(user, roots, name="second")
    stage_start(stage_name="prepare", record_id=first.preparation.pk, worker="cpu@this-host")
    stage_fail(stage_name="prepare", record_id=first.preparation.pk, error="OSError: disk full", log_tail="")
    # The older run is retried after the newer one was queued: its message is behind, but the turn of
    # the queue goes to the earlier-launched run (runs.pipeline.dispatch.launch_order).
    assert services.run_retry(run=first, user=user) == 5
    _catalogues_done()
    html = _page(client, user)
    assert "Within a queue, runs go in the order they were launched" in html
    prepares = [(run, state) for kind, run, q, state in _ready(html) if kind == "prepare"]
    assert prepares == [(first.pk, "next for cpu@this-host"), (second.pk, "behind 1 in cpu")]

    # Second's extract joined the gpu queue first (its prepare finished first), yet first's goes first.
    stage_start(stage_name="prepare", record_id=second.preparation.pk, worker="cpu@this-host")
    stage_succeed(stage_name="prepare", record_id=second.preparation.pk, fields={}, log_tail="")
    stage_start(stage_name="prepare", record_id=first.preparation.pk, worker="cpu@this-host")
    stage_succeed(stage_name="prepare", record_id=first.preparation.pk, fields={}, log_tail="")
    listed = _ready(_page(client, user))
    assert [(kind, run, state) for kind, run, q, state in listed if q == "gpu" and "after" not in state] == [
        ("extract", first.pk, "next for cpu@this-host"), ("extract", second.pk, "behind 1 in gpu")]
    api = client.get("/api/v1/workers/").json()["queue"]
    assert [(i["run_id"], i["ahead"]) for i in api if i["kind"] == "extract"] == [(first.pk, 0), (second.pk, 1)]


def test_a_stage_queued_again_after_a_lost_lease_keeps_its_runs_place_in_launch_order(client, user, roots):
    from runs.pipeline.lifecycle.stage_services import stages_reconcile

    cpu_worker("cpu@this-host", queues=("cpu", "gpu"))
    first = _launch(user, roots, name="first")
    stage_start(stage_name="prepare", record_id=first.preparation.pk, worker="gone@old-host")
    second = _launch(user, roots, name="second")
    type(first.preparation).objects.filter(pk=first.preparation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert stages_reconcile() == [f"prepare {first.preparation.pk} queued again (attempt 2 of 3)"]
    _catalogues_done()
    first.preparation.refresh_from_db()
    assert first.preparation.queued_at > second.preparation.queued_at
    prepares = [(run, state) for kind, run, q, state in _ready(_page(client, user)) if kind == "prepare"]
    assert prepares == [(first.pk, "next for cpu@this-host"), (second.pk, "behind 1 in cpu")]


def test_a_stage_waiting_behind_a_later_runs_running_stage_names_it_on_its_run_page(client, user, roots):
    cpu_worker("cpu@this-host", queues=("cpu", "gpu"))
    first = _launch(user, roots, name="first")
    second = _launch(user, roots, name="second")
    _catalogues_done()
    client.force_login(user)
    assert 'data-field="queue-note"' not in client.get(f"/runs/{first.pk}/").content.decode()
    # The worker took the later run's prepare (as one does when the earlier one was not ready yet).
    stage_start(stage_name="prepare", record_id=second.preparation.pk, worker="cpu@this-host")
    page = client.get(f"/runs/{first.pk}/").content.decode()
    assert (f"waits behind run {second.pk}&#x27;s prepare dataset stage, launched later, which cpu@this-host took "
            "from cpu") in page
    assert "waits behind" not in client.get(f"/runs/{second.pk}/").content.decode()


def test_the_note_does_not_name_a_later_run_of_another_project(client, user, roots):
    """The run page is one body for everyone who sees the run; a later run in a project they may not see
    is not named (the project wall answers such a run as if it did not exist)."""
    from runs.projects.models import Project

    cpu_worker("cpu@this-host", queues=("cpu", "gpu"))
    first = _launch(user, roots, name="first")
    second = _launch(user, roots, name="secret-second")
    type(second).objects.filter(pk=second.pk).update(
        project=Project.objects.create(name="walled", open_to_all=False, created_by=user))
    _catalogues_done()
    client.force_login(user)
    stage_start(stage_name="prepare", record_id=second.preparation.pk, worker="cpu@this-host")
    page = client.get(f"/runs/{first.pk}/").content.decode()
    assert "waits behind another run&#x27;s prepare dataset stage, launched later" in page
    assert f"run {second.pk}" not in page and "secret-second" not in page


def test_a_checkpoints_own_measurement_is_listed_queued_and_running_and_named_only_to_who_sees_it(
        client, user, roots, django_user_model):
    """An evaluation asked for on a checkpoint has no run: its checkpoint decides who sees it (the page
    answered 500 on such a row, looking for a job subject that 'evaluate' lacked)."""
    from runs.checkpoints.evaluation import evaluation_request
    from runs.models import Checkpoint
    from runs.projects.models import Project

    fake_gpu_worker("gpu@this-host")
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64), enqueue=False, name="walled-run")
    type(run).objects.filter(pk=run.pk).update(
        project=Project.objects.create(name="walled", open_to_all=False, created_by=user))
    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/checkpoints/0")
    measurement, _ = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)
    assert measurement.run_id is None
    staff = django_user_model.objects.create_user("staff-reader", is_staff=True)
    outsider = django_user_model.objects.create_user("outsider")
    link = f"/checkpoints/{checkpoint.pk}/"
    for state in ("queued", "running"):
        if state == "running":
            stage_start(stage_name="evaluate", record_id=measurement.pk, worker="gpu@this-host")
        assert link in _page(client, staff), state
        page = _page(client, outsider)
        assert link not in page and "walled" not in page, state
        assert client.get("/api/v1/workers/").status_code == 200
