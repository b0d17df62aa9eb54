"""`make demo`'s target is built by a cpu worker as a job (runs.pipeline.jobs.models.DemoBuild), so the login
comes first: the launch page shows the build's step while a real worker trains it, a launch naming the
demo's paths meanwhile is refused saying how far it is, and asking again once it is built reuses it."""
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from runs.models import PendingEnqueue, PipelineRun
from runs.pipeline.jobs import services as job_services
from runs.pipeline.jobs.models import DemoBuild
from runs.pipeline.lifecycle.stage_services import stages_reconcile

STEPS = 100  # long enough on 2 busy cores to be seen half-way (progress is written every second)
FORM = {"max_seq_len": 512, "draft_vocab_size": 64, "epochs": 1, "lr": 0.0003, "ttt_steps": 3}


def queue_build(out_dir, steps=STEPS) -> str:
    out = StringIO()
    call_command("build_demo_assets", str(out_dir), "--as-job", "--conversations", "150", "--train-steps", str(steps),
                 stdout=out)
    return out.getvalue()


def test_a_worker_builds_the_demo_target_the_pages_show_its_step_and_a_launch_waits_for_it(
        worker, user, client, tmp_path):
    out_dir = tmp_path / "demo"
    said = queue_build(out_dir)
    build = DemoBuild.objects.get()
    assert f"demo build {build.pk} is queued on the cpu queue" in said
    client.force_login(user)
    target, chats = out_dir / "demo-target", out_dir / "demo-chats.jsonl"

    deadline = time.monotonic() + 600
    while not (build.status == "running" and 3 <= build.progress_done < build.progress_total):
        assert build.status in ("queued", "running") and time.monotonic() < deadline, (build.status, build.error)
        time.sleep(0.2)
        build.refresh_from_db()
    page = client.get("/runs/new/").content.decode()
    shown = page.split('id="demo-build"')[1].split("</p>")[0]
    step = int(shown.split("step ")[1].split(" of")[0])
    assert f"The demo target is still being built: step {step} of {STEPS + 3}." in shown and 3 <= step < STEPS + 3
    assert f'value="{target}"' in page and f'value="{chats}"' in page  # the form offers the paths being built
    # The fleet page lists running and queued work by subject: a job with none answered 500 (KeyError) there.
    assert client.get("/workers/").status_code == 200

    response = client.post("/runs/new/", {**FORM, "target_path": str(target), "dataset_path": str(chats)})
    assert response.status_code == 400 and PipelineRun.objects.count() == 0
    refusal = response.content.decode().split('id="launch-errors"')[1].split("</div>")[0]
    assert "the demo target is still being built: step " in refusal and "Launch again once it is ready" in refusal

    while build.status != "succeeded":
        assert build.status in ("queued", "running") and time.monotonic() < deadline, (build.status, build.error)
        time.sleep(0.5)
        build.refresh_from_db()
    weights = target / "model.safetensors"
    assert weights.stat().st_size > 1_000_000 and len(chats.read_text().splitlines()) == 150
    assert build.final_loss < build.initial_loss
    assert 'id="demo-build"' not in client.get("/runs/new/").content.decode()

    # `make demo` again: nothing queued, nothing rewritten.
    built_at = weights.stat().st_mtime_ns
    assert "already built" in queue_build(out_dir)
    assert DemoBuild.objects.count() == 1 and not PendingEnqueue.objects.filter(kind="demo_build").exists()
    assert weights.stat().st_mtime_ns == built_at


@pytest.mark.django_db
def test_asking_while_a_build_is_queued_returns_it_and_a_lost_build_is_queued_again(tmp_path,
                                                                                   django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        first = job_services.demo_build_request(out_dir=tmp_path / "demo", num_conversations=150, train_steps=20)
        again = job_services.demo_build_request(out_dir=tmp_path / "demo", num_conversations=150, train_steps=20)
    assert again == first and DemoBuild.objects.count() == 1

    # A `make demo` stopped half-way: its worker's lease lapses, the reconciler queues the build again, and the
    # next `make demo` finds that one rather than starting a second.
    DemoBuild.objects.filter(pk=first.pk).update(status="running", started_at=timezone.now(), worker="cpu@gone",
                                                 lease_expires_at=timezone.now() - timedelta(seconds=1),
                                                 progress_done=7, progress_total=23)
    with django_capture_on_commit_callbacks(execute=False):
        stages_reconcile()
        resumed = job_services.demo_build_request(out_dir=tmp_path / "demo", num_conversations=150, train_steps=20)
    first.refresh_from_db()
    assert resumed == first and first.status == "queued" and first.progress_done == 0
    assert DemoBuild.objects.count() == 1
