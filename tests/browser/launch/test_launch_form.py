"""The launch form in headless Chromium: errors on their fields and summarised at the top (linking to
them), advanced settings folded unless one of them is wrong, selects inside their card, and the
target's weights in readable units. No worker: nothing here runs a stage."""
import re

import pytest
from playwright.sync_api import expect

from tests.helpers.fleet import cpu_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def log_in(page, live_server, user):
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")


def fill_valid(page, roots):
    page.fill("#id_target_path", str(roots / "target"))
    page.fill("#id_dataset_path", str(roots / "chats.jsonl"))
    page.fill("#id_draft_vocab_size", "64")


def field_error(page, name):
    return page.locator(f'.field[data-field="{name}"] .field-error')


def test_form_errors_are_on_their_fields_and_summarised_at_the_top(live_server, user, roots, page):
    log_in(page, live_server, user)
    page.goto(live_server.url + "/runs/new/")
    fill_valid(page, roots)
    page.fill("#id_epochs", "5000")
    page.fill("#id_layer_ids", "2, four")
    page.click("#launch-submit")

    summary = page.locator("#launch-errors")
    expect(summary).to_contain_text("2 problems to fix before launching")
    expect(summary.locator('a[href="#id_layer_ids"]')).to_have_text("Layer ids")
    expect(summary.locator('a[href="#id_epochs"]')).to_have_text("Epochs")
    expect(summary).to_contain_text("Ensure this value is less than or equal to 1000")
    expect(field_error(page, "epochs")).to_contain_text("less than or equal to 1000")
    expect(field_error(page, "layer_ids")).to_contain_text("layer ids must be integers separated by commas")
    assert page.locator("#launch-errors").bounding_box()["y"] < 300  # on the first screen
    expect(page.locator("#advanced")).not_to_have_attribute("open", "")  # nothing wrong in there
    page.click('#launch-errors a[href="#id_epochs"]')
    expect(page).to_have_url(re.compile(r"#id_epochs$"))

    # What the launch itself refuses (the dataset, layer ids the target has not) is on its field too.
    page.fill("#id_epochs", "1")
    page.fill("#id_layer_ids", "2, 9")
    page.click("#launch-submit")
    expect(field_error(page, "layer_ids")).to_contain_text("layer ids [9] are outside this target")
    expect(page.locator("#launch-errors")).to_contain_text("layer ids [9] are outside this target")
    page.fill("#id_layer_ids", "")
    page.fill("#id_dataset_path", str(roots / "missing.jsonl"))
    page.click("#launch-submit")
    expect(field_error(page, "dataset_path")).to_contain_text("missing.jsonl")
    expect(page.locator('#launch-errors a[href="#id_dataset_path"]')).to_have_text("Chat dataset (JSONL)")


def test_advanced_settings_are_folded_and_open_when_one_is_wrong(live_server, user, roots, page):
    cpu_worker(probe_queues=False)  # the backends' options then say why vLLM is not available, at length
    log_in(page, live_server, user)
    page.goto(live_server.url + "/runs/new/")
    advanced = page.locator("#advanced")
    expect(advanced).not_to_have_attribute("open", "")
    expect(page.locator("#id_seed")).to_be_hidden()
    expect(page.locator("#id_epochs")).to_be_visible()  # the settings most runs change stay out
    page.click("#advanced > summary")
    expect(page.locator("#id_seed")).to_be_visible()
    # A select whose options carry long reasons stays inside the form's card.
    form_box = page.locator("#launch-form").bounding_box()
    for select in ("#id_extraction_backend", "#id_training_backend"):
        box = page.locator(select).bounding_box()
        assert box["x"] >= form_box["x"] and box["x"] + box["width"] <= form_box["x"] + form_box["width"], select

    fill_valid(page, roots)
    page.fill("#id_val_fraction", "0.9")
    page.click("#launch-submit")
    expect(page.locator("#advanced")).to_have_attribute("open", "")
    expect(field_error(page, "val_fraction")).to_contain_text("less than or equal to 0.49")
    expect(page.locator('#launch-errors a[href="#id_val_fraction"]')).to_have_text("Validation fraction")


def test_the_targets_weights_are_shown_in_readable_units(live_server, user, tiny_target, page):
    size = sum(p.stat().st_size for p in tiny_target.target_dir.glob("*.safetensors"))
    assert 1e6 <= size < 1e9  # a few MB: "0.0 GB" was the old text
    log_in(page, live_server, user)
    page.goto(live_server.url + "/runs/new/")
    page.fill("#id_target_path", str(tiny_target.target_dir))
    page.dispatch_event("#id_target_path", "change")
    expect(page.locator("#target-info")).to_contain_text(f"Weights: {size / 1e6:.1f} MB.")
