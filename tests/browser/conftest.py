"""Headless Chromium for the browser tests: Debian's chromium driven by Playwright (which cannot
download its own browser here)."""
import os

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls of the fixtures are still sync.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import sync_playwright  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def page(tmp_path):
    """A 1280x1800 page; the last state is saved as last-page.png in the test's temp folder."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run `make browser-deps` (Debian's chromium package)")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 1800})
        yield page
        page.screenshot(path=str(tmp_path / "last-page.png"), full_page=True)
        browser.close()
