"""The checkpoint page's serve check: asking for one (once while pending), what it shows, and a draft
marked unusable when its speculative text differs from the target's."""
import json

import pytest

from runs.pipeline import services
from runs.pipeline.jobs.models import ServeCheck
from runs.models import Checkpoint, Evaluation, PendingEnqueue, StageStatus
from runs.pipeline.dispatch.queue import job_queue
from runs.pipeline.launch.run_config import RunConfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def checkpoint(user, roots):
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(), enqueue=False)
    ckpt_dir = roots / "runs" / "ckpt"
    ckpt_dir.mkdir(parents=True)
    (ckpt_dir / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"proposal_type": "greedy", "speculative_tokens": 3}]}}))
    return Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=str(ckpt_dir))


def _measured(checkpoint, **fields) -> Evaluation:
    values = dict(status=StageStatus.SUCCEEDED, tau=2.5, output_matches_greedy=True, max_new_tokens=48, max_prompts=12)
    return Evaluation.objects.create(checkpoint=checkpoint, **{**values, **fields})


def test_a_serve_check_needs_a_measurement_first_and_says_so(client, user, checkpoint):
    client.force_login(user)
    page = client.get(checkpoint.get_absolute_url()).content.decode()
    assert 'id="serve-check-submit" disabled' in page and "not checked yet" in page
    outbox = PendingEnqueue.objects.count()
    response = client.post(f"/checkpoints/{checkpoint.pk}/serve-check/", follow=True)
    assert "has no finished measurement of its acceptance length: measure it first" in response.content.decode()
    assert ServeCheck.objects.count() == 0 and PendingEnqueue.objects.count() == outbox


def test_clicking_twice_queues_one_check_on_vllm_with_the_measurements_settings(client, user, checkpoint):
    evaluation = _measured(checkpoint)
    client.force_login(user)
    first = client.post(f"/checkpoints/{checkpoint.pk}/serve-check/", follow=True).content.decode()
    check = ServeCheck.objects.get()
    assert f"Serve check {check.pk} queued on vllm.1" in first
    assert (check.evaluation, check.max_new_tokens, check.status, check.requested_by) == (
        evaluation, 48, StageStatus.QUEUED, user)
    assert check.concurrency == [1, 8, 32]  # the run's serve_concurrency, its default here
    assert job_queue(job_name="serve_check", record_id=check.pk) == "vllm.1"
    second = client.post(f"/checkpoints/{checkpoint.pk}/serve-check/", follow=True).content.decode()
    assert f"Serve check {check.pk} of this measurement is already queued" in second
    assert ServeCheck.objects.count() == 1
    assert "waiting for a worker with vLLM (queue vllm.1" in second


def test_the_page_shows_vllms_tau_beside_ours_and_warns_past_the_tolerance(client, user, checkpoint):
    evaluation = _measured(checkpoint, tau=2.0)
    ServeCheck.objects.create(checkpoint=checkpoint, evaluation=evaluation, status=StageStatus.SUCCEEDED, tau=2.0,
                              vllm_tau=2.2, vllm_tau_emitted=2.1, tau_difference=0.1, vllm_output_matches_greedy=True,
                              vllm_acceptance_per_position=[0.6, 0.3, 0.2], vllm_version="0.32.0+cpu",
                              vllm_build="cpu", num_prompts=12, max_new_tokens=48, num_speculative_tokens=3,
                              vllm_tokens_per_s_with=50.0, vllm_tokens_per_s_without=40.0, vllm_speedup=1.25,
                              dtype="float32", command="vllm serve /t --speculative-config '{}'", prompts_count=12,
                              prompts_sha256="ab12cd34ef56" + "0" * 52, vllm_drafts=40, vllm_decode_steps=41,
                              vllm_replies_cut=1)
    client.force_login(user)
    page = client.get(checkpoint.get_absolute_url()).content.decode()
    assert "2.100" in page and "its counters: 2.200" in page and "ours on the same prompts: 2.000" in page
    assert "differs from ours by 0.100, more than 0.05" in page
    assert "1.25× the tokens/s of the target alone" in page
    # which prompts both sides decoded: their count and hash (short), beside both τ and in the list
    assert "12 prompts, sha256 ab12cd34ef56)" in page and page.count(">ab12cd34ef56</code>") == 2
    assert "1 reply stopped there, the others at the end token" in page and "40 steps with drafts of 41" in page
    # vLLM's per-position counters are shown as its own, saying why they are not set beside ours
    assert "vLLM's own counters per position: 0.600 / 0.300 / 0.200" in page
    assert "cannot be cut back to what the replies kept" in page
    assert 'id="unusable"' not in page


@pytest.mark.parametrize("who", ["ours", "vllm"])
def test_a_draft_that_changes_the_text_is_marked_unusable(client, user, checkpoint, who):
    evaluation = _measured(checkpoint, output_matches_greedy=who != "ours", mismatched_prompts=[3] if who == "ours" else [])
    if who == "vllm":
        ServeCheck.objects.create(checkpoint=checkpoint, evaluation=evaluation, status=StageStatus.SUCCEEDED,
                                  vllm_output_matches_greedy=False, mismatched_prompts=[0, 4])
    client.force_login(user)
    page = client.get(checkpoint.get_absolute_url()).content.decode()
    assert 'id="unusable"' in page and "Do not deploy this draft" in page
    assert ("on 1 prompt(s) when its acceptance was measured" if who == "ours"
            else "output with the draft differed from the target&#x27;s alone on 2 prompt(s)") in page
    summary = client.get(f"/api/v1/runs/{checkpoint.training_run.run_id}/status/").json()
    row = summary["checkpoints"][0]
    assert row["usable"] is False and "Do not deploy" not in row["unusable_why"] and row["unusable_why"]


def test_the_run_page_shows_the_serve_check_of_its_measurement(client, user, checkpoint):
    run = checkpoint.training_run.run
    type(run.evaluation).objects.filter(pk=run.evaluation.pk).update(
        checkpoint=checkpoint, status=StageStatus.SUCCEEDED, tau=2.0, output_matches_greedy=True)
    ServeCheck.objects.create(checkpoint=checkpoint, evaluation_id=run.evaluation.pk, status=StageStatus.FAILED,
                              error="VllmServerError: vllm serve stopped before it was ready: exit code 1")
    client.force_login(user)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "serve check failed" in page and "vllm serve stopped before it was ready" in page
    summary = client.get(f"/api/v1/runs/{run.pk}/status/").json()["serve_check"]
    assert summary["status"] == "failed" and summary["vllm_tau"] is None
    assert summary["prompts_count"] is None and summary["prompts_sha256"] == ""


def test_the_api_gives_the_prompt_lists_count_and_hash(client, user, checkpoint):
    run = checkpoint.training_run.run
    type(run.evaluation).objects.filter(pk=run.evaluation.pk).update(
        checkpoint=checkpoint, status=StageStatus.SUCCEEDED, tau=2.0, output_matches_greedy=True, num_prompts=12)
    digest = "ab12cd34ef56" + "0" * 52
    ServeCheck.objects.create(checkpoint=checkpoint, evaluation_id=run.evaluation.pk, status=StageStatus.SUCCEEDED,
                              tau=2.0, vllm_tau=2.4, vllm_tau_emitted=2.0, tau_difference=0.0, prompts_count=12,
                              prompts_sha256=digest, vllm_drafts=40, vllm_decode_steps=40, vllm_replies_cut=3)
    client.force_login(user)
    summary = client.get(f"/api/v1/runs/{run.pk}/status/").json()["serve_check"]
    assert (summary["prompts_count"], summary["prompts_sha256"]) == (12, digest)
    assert (summary["vllm_decode_steps"], summary["vllm_replies_cut"], summary["disagrees"]) == (40, 3, False)


def test_the_page_shows_the_speedup_at_each_concurrency_as_cpu_figures(client, user, checkpoint):
    """The serve check's table (issue 39): a row per concurrency as stored, labelled CPU figures on vLLM's CPU build."""
    evaluation = _measured(checkpoint)
    rows = [{"concurrency": c, "requests": max(c, 12), "device": "cpu", "tokens_per_s_with": w,
             "tokens_per_s_without": o, "tpot_ms_with": 9.5, "tpot_ms_without": 12.4, "speedup": w / o}
            for c, w, o in ((1, 40.0, 32.0), (8, 150.0, 160.0))]
    ServeCheck.objects.create(checkpoint=checkpoint, evaluation=evaluation, status=StageStatus.SUCCEEDED, tau=2.5,
                              vllm_tau=2.6, vllm_tau_emitted=2.5, tau_difference=0.0, vllm_output_matches_greedy=True,
                              vllm_tokens_per_s_with=40.0, vllm_tokens_per_s_without=32.0, vllm_speedup=1.25,
                              vllm_version="0.32.0", vllm_build="cpu", num_speculative_tokens=3,
                              concurrency=[1, 8], concurrency_results=rows)
    client.force_login(user)
    page = client.get(checkpoint.get_absolute_url()).content.decode()
    assert "<strong>CPU figures</strong>" in page and 'id="serve-speedup-cpu"' in page
    assert '<tr data-concurrency="1"><td>1</td><td>12</td><td>40.0</td><td>32.0</td><td>9.5</td><td>12.4</td><td>1.25×</td>' in page
    assert '<tr data-concurrency="8"><td>8</td><td>12</td><td>150.0</td><td>160.0</td>' in page and "0.94×" in page
