"""The browser tests' Chromium page (tests/browser/conftest.py) for the reports' browser tests here."""
from tests.browser.conftest import page  # noqa: F401 - a fixture, found by its name
