"""Team review: comments by anyone signed in, approvals and change requests by reviewers."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Model

from runs.models import Checkpoint, Extraction, PipelineRun, Review
from runs.roles import require
from workers.stages.errors import InputError

SUBJECTS = {"run": PipelineRun, "extraction": Extraction, "checkpoint": Checkpoint}


def review_add(*, user: AbstractBaseUser, subject: Model, decision: str, text: str) -> Review:
    text = text.strip()
    if decision not in Review.Decision.values:
        raise InputError(f"unknown decision {decision!r}: use one of {', '.join(Review.Decision.values)}")
    if not text:
        raise InputError("write a comment: a review needs its reason in words")
    if decision != Review.Decision.COMMENT:
        require(user, "review")
    field = next(name for name, model in SUBJECTS.items() if isinstance(subject, model))
    return Review.objects.create(author=user, decision=decision, text=text, **{field: subject})


def review_state(subject: Model) -> Review | None:
    """The latest approval or change request: what the lists show."""
    return subject.reviews.exclude(decision=Review.Decision.COMMENT).select_related("author").order_by("-created_at", "-id").first()
