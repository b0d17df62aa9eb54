"""A failed run's page, in headless Chromium against a real worker: the failure reads as a sentence
naming what to change, never a traceback; Retry is offered only where a retry can succeed (a lost
worker), and a failure the run's files caused offers "Copy with changes" with the field marked."""
import shutil
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from runs.models import PipelineRun, Preparation, StageStatus
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stage_services import MAX_ATTEMPTS, stage_record_id, stage_start, stages_reconcile
from tests.browser.launch.test_launch_form import log_in
from tests.helpers.worker import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BANNER = "Traceback (most recent call last)"
CONFIG = RunConfig(max_seq_len=256, draft_vocab_size=64, epochs=1, ttt_steps=1, eval_prompts=2, eval_max_new_tokens=8)


def _statuses(run) -> list[str]:
    run = PipelineRun.objects.get(pk=run.pk)
    return [run.preparation.status, run.extract_stage.status, run.training_run.status]


def test_a_target_without_tokenizer_fails_in_a_sentence_with_copy_with_changes_and_no_retry(
        tiny_target, data_root, worker, user, live_server, page):
    target = data_root / "no-tokenizer"
    shutil.copytree(tiny_target.target_dir, target)
    (target / "tokenizer.json").unlink()  # the launch leaves this to the prepare stage (dataset_launch_check)
    run = services.run_launch(user=user, target_path=target, dataset_path=tiny_target.chats_path, config=CONFIG)
    wait_for_run(run.pk, timeout=240, log_path=worker.log_path)
    prep = Preparation.objects.get(run=run)
    assert prep.status == StageStatus.FAILED and BANNER not in prep.error and "Frames, innermost last" in prep.error_trace
    assert (prep.failure_kind, prep.failure_field) == ("inputs", "target_path")

    log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    sentence = (f"The target's tokenizer could not be loaded from {target}: tokenizer.json is missing or unreadable. "
                "Pick another target or add the file.")
    expect(page.locator("#run-failure")).to_contain_text(sentence)
    expect(page.locator('tr[data-stage-detail="prepare"] [data-field="error"]')).to_have_text(sentence)
    expect(page.locator("#retry-form")).to_be_hidden()
    expect(page.locator("#copy-with-changes")).to_be_visible()
    assert BANNER not in page.content()

    # The API says why no retry, and refuses one with 400, changing nothing.
    answer = page.request.get(f"{live_server.url}/api/v1/runs/{run.pk}/").json()
    assert answer["failure"]["retryable"] is False and "a retry with the same files fails" in answer["failure"]["why"]
    client = Client()
    client.force_login(user)
    refused = client.post(f"/api/v1/runs/{run.pk}/retry/", content_type="application/json", data={})
    assert refused.status_code == 400 and "cannot be retried" in refused.json()["error"], refused.content
    assert refused.json()["fields"] == {"target_path": refused.json()["error"]}
    assert _statuses(run) == [StageStatus.FAILED, StageStatus.CANCELLED, StageStatus.CANCELLED]

    page.click("#copy-with-changes")
    expect(page.locator('.field.change-this[data-field="target_path"]')).to_be_visible()
    expect(page.locator("#change-this")).to_contain_text(sentence)
    expect(page.locator("#id_target_path")).to_have_value(str(target))


def test_a_lost_worker_offers_retry_and_retry_queues_the_run_again(roots, user, live_server, page):
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64))
    prep = stage_record_id(stage_name="prepare", run_id=run.pk)
    for attempt in range(MAX_ATTEMPTS):  # each worker took it and stopped renewing its lease
        stage_start(stage_name="prepare", record_id=prep, worker=f"gone{attempt}")
        Preparation.objects.filter(pk=prep).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        stages_reconcile()
    assert Preparation.objects.get(pk=prep).failure_kind == "transient"

    log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#run-failure")).to_contain_text("The preparation lost its worker (worker gone2 stopped renewing "
                                                         "its lease")
    expect(page.locator("#run-failure")).to_contain_text("Retry is offered")
    expect(page.locator("#copy-with-changes")).to_be_hidden()
    page.click("#retry-form button")
    expect(page.locator("#run-failure")).to_have_count(0)
    assert Preparation.objects.get(pk=prep).status == StageStatus.QUEUED
    assert Preparation.objects.get(pk=prep).failure_kind == ""


def test_a_run_that_fails_while_its_page_is_open_offers_its_remedy_without_a_reload(roots, user, live_server, page):
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64))
    prep = stage_record_id(stage_name="prepare", run_id=run.pk)
    for attempt in range(MAX_ATTEMPTS - 1):  # two workers took it and stopped renewing its lease
        stage_start(stage_name="prepare", record_id=prep, worker=f"gone{attempt}")
        Preparation.objects.filter(pk=prep).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        stages_reconcile()
    stage_start(stage_name="prepare", record_id=prep, worker="gone-last")

    log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#run-status")).to_have_text("running")
    expect(page.locator("#retry-form")).to_be_hidden()
    expect(page.locator("#copy-with-changes")).to_be_hidden()
    expect(page.locator("#run-failure")).to_have_count(0)

    Preparation.objects.filter(pk=prep).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    stages_reconcile()  # the third lost lease fails the run while the page polls
    expect(page.locator("#run-status")).to_have_text("failed", timeout=15_000)
    expect(page.locator("#run-failure")).to_contain_text("The preparation lost its worker (worker gone-last stopped "
                                                         "renewing its lease")
    expect(page.locator("#run-failure")).to_contain_text("Retry is offered")
    expect(page.locator("#retry-form")).to_be_visible()
    expect(page.locator("#copy-with-changes")).to_be_hidden()
    page.click("#retry-form button")
    expect(page.locator("#run-failure")).to_have_count(0)
    assert Preparation.objects.get(pk=prep).status == StageStatus.QUEUED
