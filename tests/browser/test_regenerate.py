"""A person regenerates a dataset's replies from its page, follows the job to its end, opens the dataset it
made and finds its lineage there and in the launch form; a target that cannot chat is refused on its field.
Headless Chromium against the live server and a real Celery worker (transformers on the demo target)."""
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from runs.pipeline import services

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _log_in(page, live_server, user) -> None:
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")


def test_user_regenerates_a_dataset_and_sees_its_lineage(live_server, worker, user, tiny_target, tmp_path,
                                                         config_only_target, page):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(tiny_target.chats_path.read_text(encoding="utf-8").splitlines(keepends=True)[:8]),
                     encoding="utf-8")
    services.target_register(path=tiny_target.target_dir)
    services.target_register(path=config_only_target)  # no tokenizer, no chat template
    source = services.dataset_register(path=chats)
    _log_in(page, live_server, user)

    page.goto(f"{live_server.url}/datasets/{source.pk}/")
    expect(page.locator("#lineage")).to_contain_text("Brought by a user")
    page.click("summary:has-text('Regenerate the replies')")
    page.select_option("#id_target", label=config_only_target.name)
    page.select_option("#id_backend", "transformers")
    page.click("#regenerate-form button[type=submit]")
    # Refused on its field, saying what the target lacks; nothing queued.
    expect(page.locator("#regenerate-form .field-error")).to_contain_text("has no tokenizer")
    expect(page.locator("table.regenerations")).to_have_count(0)

    page.select_option("#id_target", label=tiny_target.target_dir.name)
    page.select_option("#id_backend", "transformers")
    page.fill("#id_max_new_tokens", "16")
    page.click("#regenerate-form button[type=submit]")
    expect(page.locator(".message.success, .messages")).to_contain_text("queued")
    row = page.locator("table.regenerations tbody tr").first
    # The page follows the job (it reloads while one is queued or running) until it succeeds.
    expect(row.locator(".status")).to_have_text("succeeded", timeout=300_000)
    expect(row).to_contain_text("8 conversations")
    row.locator("a").first.click()

    expect(page).to_have_url(re.compile(r"/datasets/\d+/$"))
    lineage = page.locator("#lineage")
    expect(lineage).to_contain_text(f"Made from {source.name}")
    expect(lineage).to_contain_text(tiny_target.target_dir.name)
    expect(lineage).to_contain_text("greedy")
    made_path = page.locator("h1 + p code").first.inner_text()
    assert Path(made_path).parent == chats.parent / "regenerated" and Path(made_path).is_file()

    page.goto(f"{live_server.url}/runs/new/")
    options = page.locator("#datasets option")
    values = [options.nth(i).get_attribute("value") for i in range(options.count())]
    assert values.index(made_path) == values.index(str(chats)) + 1  # listed right under its source
    assert "on-policy for" in page.locator(f'#datasets option[value="{made_path}"]').evaluate("o => o.textContent")
