"""The run page's Export button in headless Chromium: the checkpoints table is rendered once for every
viewer, without a CSRF token of its own (static/js/runs/checkpoint_export.js adds the page's); a click writes the
folder under the runs folder's exports/ and the run page says where, with the serve line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from runs.models import Checkpoint
from tests.browser.every_page.test_pages_at_a_glance import _log_in
from tests.services.checkpoints.test_best_by_tau import _launch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_export_from_the_run_page_writes_the_folder_and_says_where(live_server, user, roots, page, settings):
    run = _launch(user, roots)
    folder = Path(run.output_dir) / "checkpoints" / "0"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    (folder / "model.safetensors").write_bytes(b"weights")
    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=str(folder), val_loss=1.0)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.locator("#checkpoint-table form.export-checkpoint button").click()
    expect(page.locator("div.message").first).to_contain_text("Exported to", timeout=20_000)
    exports = list((Path(settings.EAGLE3WEB_RUNS_DIR) / "exports").iterdir())
    assert [p.name.startswith(f"checkpoint-{checkpoint.pk}-epoch-1-") for p in exports] == [True]
    assert sorted(p.name for p in exports[0].iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert page.url.endswith(f"/runs/{run.pk}/")  # back on the run page
    expect(page.locator("body")).to_contain_text(f'"model": "{exports[0]}"')
