"""A person picks the extraction and training backends on the launch form in headless Chromium:
what no live worker can run is offered disabled with the reason, and a run launched with vLLM and
speculators' trainer says so on its page and waits in the queue of a worker that fits it.

The GPU host is a FAKE worker row (tests/helpers/fleet.py): no GPU or second host exists here."""
import re

import pytest
from playwright.sync_api import expect

from runs.models import PipelineRun
from tests.helpers.fleet import cpu_worker, fake_gpu_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def log_in(page, live_server, user):
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")


def test_gpu_backends_are_disabled_with_a_reason_then_chosen_once_a_fake_gpu_worker_is_live(
        live_server, user, roots, page):
    # This machine, started with EAGLE3WEB_WORKER_GPU_QUEUES=0 -Q cpu,gpu: no GPU, and no vLLM queue taken
    # (whether or not `make vllm` installed vLLM's CPU build here).
    cpu_worker(probe_queues=False)
    log_in(page, live_server, user)
    page.goto(live_server.url + "/runs/new/")
    vllm = page.locator('#id_extraction_backend option[value="vllm"]')
    expect(vllm).to_be_disabled()
    expect(vllm).to_contain_text("not available: no live worker")
    expect(page.locator('#id_training_backend option[value="speculators"]')).to_be_disabled()

    fake_gpu_worker()  # FAKE: an 8-GPU host with vLLM and speculators joins the fleet
    page.reload()
    expect(page.locator('#id_extraction_backend option[value="vllm"]')).to_be_enabled()
    page.fill("#id_target_path", str(roots / "target"))
    page.fill("#id_dataset_path", str(roots / "chats.jsonl"))
    page.click("#advanced > summary")  # backends and GPU counts are advanced settings, folded
    page.select_option("#id_extraction_backend", "vllm")
    page.fill("#id_tensor_parallel_size", "2")
    page.select_option("#id_training_backend", "speculators")
    page.fill("#id_train_gpus", "4")
    page.click("#launch-submit")

    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    backends = page.locator("#backends")
    expect(backends).to_contain_text("on 2 GPUs")
    expect(backends).to_contain_text("on 4 GPUs")
    run = PipelineRun.objects.get()
    assert (run.config["extraction_backend"], run.config["tensor_parallel_size"]) == ("vllm", 2)
    assert (run.config["training_backend"], run.config["train_gpus"]) == ("speculators", 4)

    page.click("text=workers")
    expect(page.locator("body")).to_contain_text("vllm.2")  # the queue its extraction waits in
