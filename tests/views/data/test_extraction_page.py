"""The extraction review page: verification, lengths and the scale forecast with its arithmetic."""

import pytest

from runs.data.extractions import extraction_import
from runs.data.selectors import extraction_forecast
from tests.contract.test_verify import write_flat

pytestmark = pytest.mark.django_db


@pytest.fixture
def extraction(tmp_path, config_only_target):
    target = config_only_target
    extraction, _ = extraction_import(path=write_flat(tmp_path / "e"), target_path=target)
    return extraction


@pytest.fixture
def run_extraction(tmp_path, user, config_only_target, django_capture_on_commit_callbacks):
    """A run's own extraction, its stage having measured load time and throughput."""
    from runs.pipeline.launch.run_config import RunConfig
    from runs.pipeline.services import run_launch
    from tests.helpers.artifacts import extraction_written
    from tests.contract.test_verify import write_flat

    with django_capture_on_commit_callbacks(execute=False):
        run = run_launch(user=user, target_path=config_only_target, dataset_path=_chats(tmp_path),
                         config=RunConfig(draft_vocab_size=32))
    run.extract_stage.model_load_seconds, run.extract_stage.tokens_per_second = 30.0, 1000.0
    run.extract_stage.save()
    return extraction_written(run, path=write_flat(tmp_path / "run-e"), bytes_on_disk=2000, total_tokens=10)


def _chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    return path


def test_forecast_scales_measured_load_and_per_token_time(run_extraction):
    extraction = run_extraction
    extraction.bytes_on_disk, extraction.total_tokens = 2000, 10
    forecast = extraction_forecast(extraction, token_counts=(10**6,))
    row = forecast["rows"][0]
    assert row["seconds"] == pytest.approx(30.0 + 1000.0)
    assert row["bytes"] == pytest.approx(200.0 * 10**6)
    assert row["arithmetic"] == "30.00 s + 1,000,000 / 1,000 tok/s; 1,000,000 x 200.0 B"


def test_forecast_waits_for_measurements(extraction):
    assert extraction_forecast(extraction) is None  # imported: no measured load time


def test_page_shows_checks_lengths_and_forecast(client, admin_user, run_extraction):
    from runs.data.extractions import extraction_verify

    extraction = run_extraction
    extraction_verify(extraction=extraction)
    client.force_login(admin_user)
    page = client.get(extraction.get_absolute_url()).content.decode()
    assert 'id="verification"' in page and "sample_count" in page
    assert 'id="lengths"' in page
    assert 'id="forecast"' in page and "tok/s" in page
