"""Team review: comments and decisions on runs and extractions, shown where the team looks."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from runs.data.extractions import extraction_import
from runs.pipeline.jobs.models import VerificationRequest
from runs.models import Review
from tests.contract.test_verify import write_flat

pytestmark = pytest.mark.django_db


def member(username, role):
    account = get_user_model().objects.create_user(username, password=f"pw-{username}-1")
    account.groups.add(Group.objects.get_or_create(name=role)[0])
    return account


@pytest.fixture
def extraction(tmp_path, config_only_target):
    extraction, _ = extraction_import(path=write_flat(tmp_path / "review-ext"), target_path=config_only_target)
    return extraction


def test_a_reviewer_approves_and_the_list_shows_who(client, extraction):
    member("rita", "reviewer")
    client.login(username="rita", password="pw-rita-1")
    client.post(f"/reviews/extraction/{extraction.pk}/", {"decision": "approve", "text": "Shapes and totals match."})
    review = Review.objects.get()
    assert (review.author.username, review.decision, review.extraction) == ("rita", "approve", extraction)
    listing = client.get("/extractions/").content.decode()
    assert "Approve" in listing and "by rita" in listing
    page = client.get(extraction.get_absolute_url()).content.decode()
    assert "Shapes and totals match." in page


def test_a_viewer_may_comment_but_not_approve(client, extraction):
    member("vic", "viewer")
    client.login(username="vic", password="pw-vic-1")
    client.post(f"/reviews/extraction/{extraction.pk}/", {"decision": "comment", "text": "Why layer 29?"})
    response = client.post(f"/reviews/extraction/{extraction.pk}/", {"decision": "approve", "text": "lgtm"})
    assert response.status_code == 403
    assert list(Review.objects.values_list("decision", flat=True)) == ["comment"]


def test_an_empty_review_is_refused_with_a_reason(client, extraction):
    member("rita", "reviewer")
    client.login(username="rita", password="pw-rita-1")
    response = client.post(f"/reviews/extraction/{extraction.pk}/", {"decision": "approve", "text": " "}, follow=True)
    assert b"a review needs its reason in words" in response.content
    assert Review.objects.count() == 0


def test_import_from_the_browser_names_a_path_outside_the_roots(client, user):
    client.login(username="launcher", password="pw-launcher-1")
    response = client.post("/extractions/import/", {"path": "/etc", "target_path": ""})
    assert b"extraction directory /etc is outside the allowed data roots" in response.content


def run_queued_verifications():
    from workers.orchestration.tasks import stage_execute

    for job in VerificationRequest.objects.filter(status="queued"):
        assert stage_execute(stage_name="verify", record_id=job.pk, worker="test")


def test_import_from_the_browser_then_verify_in_full(client, user, tmp_path, config_only_target):
    target = config_only_target
    client.login(username="launcher", password="pw-launcher-1")
    response = client.post("/extractions/import/", {"path": str(write_flat(tmp_path / "e")), "target_path": str(target)},
                           follow=True)
    assert b"Imported extraction" in response.content and b"Waiting for a cpu worker" in response.content
    extraction_id = response.redirect_chain[-1][0].rstrip("/").split("/")[-1]
    run_queued_verifications()
    assert b"passed" in client.get(f"/extractions/{extraction_id}/").content
    response = client.post(f"/extractions/{extraction_id}/verify/", {"full": "on"}, follow=True)
    assert b"runs on a worker" in response.content and b"(every value)" in response.content
    run_queued_verifications()
    verification = VerificationRequest.objects.get(full=True).verification
    assert verification.full and verification.passed
