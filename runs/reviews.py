"""Team review: comments by anyone signed in, approvals and change requests by reviewers."""
from __future__ import annotations

import unicodedata

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Model

from runs.models import Checkpoint, Extraction, PipelineRun, Review
from runs.roles import require
from workers.stages.errors import InputError

SUBJECTS = {"run": PipelineRun, "extraction": Extraction, "checkpoint": Checkpoint}
MAX_REVIEW_CHARS = 10_000  # a review is a paragraph or a few, not a document
ALLOWED_CONTROL = "\n\r\t"  # line breaks and tabs; other control characters (NUL above all) are refused


def review_add(*, user: AbstractBaseUser, subject: Model, decision: str, text: str) -> Review:
    if not isinstance(decision, str) or decision not in Review.Decision.values:
        raise InputError(f"unknown decision {str(decision)[:40]!r}: use one of {', '.join(Review.Decision.values)}")
    if not isinstance(text, str):
        raise InputError(f"the review text must be text, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise InputError("write a comment: a review needs its reason in words")
    if len(text) > MAX_REVIEW_CHARS:
        raise InputError(f"the review text is {len(text)} characters long; at most {MAX_REVIEW_CHARS} are allowed")
    if any(unicodedata.category(c) in ("Cc", "Cs") and c not in ALLOWED_CONTROL for c in text):
        raise InputError("the review text holds control characters (such as NUL); only line breaks and tabs are allowed")
    if decision != Review.Decision.COMMENT:
        require(user, "review")
    field = next(name for name, model in SUBJECTS.items() if isinstance(subject, model))
    return Review.objects.create(author=user, decision=decision, text=text, **{field: subject})


def review_state(subject: Model) -> Review | None:
    """The latest approval or change request: what the lists show."""
    return subject.reviews.exclude(decision=Review.Decision.COMMENT).select_related("author").order_by("-created_at", "-id").first()
