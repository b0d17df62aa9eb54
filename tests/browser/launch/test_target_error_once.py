"""A target directory without config.json: the launch form says so once on its field (and in the summary
at the top), not a second time from the target's inspection (issue 28)."""
import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_target_without_config_json_is_refused_once_on_its_field(live_server, user, roots, page):
    (roots / "no-config").mkdir()
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")
    page.goto(live_server.url + "/runs/new/")
    page.fill("#id_target_path", str(roots / "no-config"))
    page.fill("#id_dataset_path", str(roots / "chats.jsonl"))
    page.fill("#id_draft_vocab_size", "64")
    page.click("#launch-submit")
    page.wait_for_load_state("networkidle")  # the page's own inspection of the target has answered
    errors = page.locator('.field[data-field="target_path"] .field-error')
    expect(errors).to_have_count(1)
    expect(errors).to_contain_text("config.json is missing")
    expect(page.locator("#launch-errors")).to_contain_text("config.json is missing")
    # Another path typed there: the field says what is wrong with that one, still once.
    (roots / "also-no-config").mkdir()
    page.fill("#id_target_path", str(roots / "also-no-config"))
    page.dispatch_event("#id_target_path", "change")
    expect(errors).to_have_count(1)
    expect(errors).to_contain_text("also-no-config/config.json is missing")
