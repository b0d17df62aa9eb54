"""The extraction review page: verification, lengths and the scale forecast with its arithmetic."""

import pytest

from runs.extraction_services import extraction_import
from runs.selectors import extraction_forecast
from tests.stages.test_verify import write_flat

pytestmark = pytest.mark.django_db


@pytest.fixture
def extraction(tmp_path, config_only_target):
    target = config_only_target
    extraction, _ = extraction_import(path=write_flat(tmp_path / "e"), target_path=target)
    return extraction


def test_forecast_scales_measured_load_and_per_token_time(extraction):
    extraction.model_load_seconds, extraction.tokens_per_second = 30.0, 1000.0
    extraction.bytes_on_disk, extraction.total_tokens = 2000, 10
    forecast = extraction_forecast(extraction, token_counts=(10**6,))
    row = forecast["rows"][0]
    assert row["seconds"] == pytest.approx(30.0 + 1000.0)
    assert row["bytes"] == pytest.approx(200.0 * 10**6)
    assert row["arithmetic"] == "30.00 s + 1,000,000 / 1,000 tok/s; 1,000,000 x 200.0 B"


def test_forecast_waits_for_measurements(extraction):
    assert extraction_forecast(extraction) is None  # imported: no measured load time


def test_page_shows_checks_lengths_and_forecast(client, admin_user, extraction):
    extraction.model_load_seconds, extraction.tokens_per_second = 2.0, 500.0
    extraction.save()
    client.force_login(admin_user)
    page = client.get(extraction.get_absolute_url()).content.decode()
    assert 'id="verification"' in page and "sample_count" in page
    assert 'id="lengths"' in page
    assert 'id="forecast"' in page and "tok/s" in page
