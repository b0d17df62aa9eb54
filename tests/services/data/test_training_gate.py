"""Training refuses an extraction whose latest verification failed, unless a reviewer overrides it."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.core.management import CommandError, call_command

from runs.data.extractions import extraction_training_gate, verification_override
from runs.models import Extraction, VerificationOverride
from tests.contract.test_verify import write_flat

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed_extraction(tmp_path, config_only_target):
    target = config_only_target
    with pytest.raises(CommandError):
        call_command("import_extraction", str(write_flat(tmp_path / "e", total_samples=99)), "--target", str(target))
    return Extraction.objects.get()


def member(role):
    account = get_user_model().objects.create_user(role, password=f"pw-{role}-1")
    account.groups.add(Group.objects.get_or_create(name=role)[0])
    return account


def test_a_failed_verification_blocks_training_and_says_what_to_do(failed_extraction):
    message = extraction_training_gate(extraction=failed_extraction)
    assert "failed verification (" in message and "sample_count" in message and "override with a written reason" in message


def test_a_reviewers_written_override_unblocks_it_and_is_kept(failed_extraction):
    override = verification_override(extraction=failed_extraction, user=member("reviewer"),
                                     reason="sample 99 was dropped on purpose; manifest is stale")
    assert extraction_training_gate(extraction=failed_extraction) is None
    assert VerificationOverride.objects.get().reason.startswith("sample 99") and override.reviewer.username == "reviewer"


def test_a_launcher_cannot_override(failed_extraction):
    with pytest.raises(PermissionDenied):
        verification_override(extraction=failed_extraction, user=member("launcher"), reason="trust me")
    assert extraction_training_gate(extraction=failed_extraction) is not None


def test_an_override_needs_a_reason(failed_extraction):
    with pytest.raises(ValueError, match="needs a written reason"):
        verification_override(extraction=failed_extraction, user=member("reviewer"), reason="  ")


def test_override_shown_on_the_extraction_page(client, failed_extraction):
    member("reviewer")
    client.login(username="reviewer", password="pw-reviewer-1")
    response = client.post(f"/extractions/{failed_extraction.pk}/override/", {"reason": "stale manifest"}, follow=True)
    assert b"Overridden by reviewer" in response.content and b"stale manifest" in response.content
