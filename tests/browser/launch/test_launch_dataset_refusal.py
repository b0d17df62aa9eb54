"""The launch form refuses an empty chat file on its field, saying it is empty, and launches nothing
(runs.pipeline.launch.dataset_launch_check), in headless Chromium."""
import pytest
from playwright.sync_api import expect

from runs.models import Dataset, PipelineRun
from tests.browser.launch.test_launch_form import field_error, fill_valid, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_form_refuses_an_empty_dataset_file_saying_it_is_empty(live_server, user, roots, page):
    (roots / "chats.jsonl").write_bytes(b"")
    log_in(page, live_server, user)
    page.goto(live_server.url + "/runs/new/")
    fill_valid(page, roots)
    page.click("#launch-submit")

    expect(field_error(page, "dataset_path")).to_contain_text(f"{roots / 'chats.jsonl'} is empty (0 bytes)")
    expect(page.locator('#launch-errors a[href="#id_dataset_path"]')).to_have_text("Chat dataset (JSONL)")
    expect(page.locator("#launch-errors")).to_contain_text("is empty (0 bytes)")
    assert "/runs/new/" in page.url
    assert (PipelineRun.objects.count(), Dataset.objects.count()) == (0, 0)
