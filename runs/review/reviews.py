"""Team review: comments by anyone signed in, approvals and change requests by reviewers."""
from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Model, OuterRef, Subquery
from django.http import Http404

from runs.checkpoints.models import Checkpoint
from runs.data.models import Extraction
from runs.pipeline.models import PipelineRun
from runs.projects import access
from runs.review.models import Review
from runs.roles import require
from workers.contract.errors import InputError

SUBJECTS = {"run": PipelineRun, "extraction": Extraction, "checkpoint": Checkpoint}
MAX_REVIEW_CHARS = 10_000  # a review is a paragraph or a few, not a document
ALLOWED_CONTROL = "\n\r\t"  # line breaks and tabs; other control characters (NUL above all) are refused


def review_subject_get(*, subject: str, pk: int, user):
    """The run, extraction or checkpoint a review is about; 404 for an unknown kind or id, and for one the
    user does not see (as if it did not exist: runs.projects.access)."""
    if subject not in SUBJECTS:
        raise Http404(f"nothing to review called {subject!r}")
    return access.visible_or_404(subject, pk, user)


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


def review_states(*, subjects: Sequence[Model] = (), kind: str = "", ids: Sequence[int] = ()) -> dict[int, Review]:
    """Each subject's latest approval or change request, by the subject's id, in one query whatever
    the number of subjects: a list page asks once for all its rows, never once per row. The subjects as
    models, or as their kind (a key of SUBJECTS) and ids (the runs list's rows are values)."""
    if subjects:
        kind = next(name for name, model in SUBJECTS.items() if isinstance(subjects[0], model))
        ids = [s.pk for s in subjects]
    if not ids:
        return {}
    decisions = Review.objects.exclude(decision=Review.Decision.COMMENT)
    latest = decisions.filter(**{kind: OuterRef(kind)}).order_by("-created_at", "-id").values("id")[:1]
    rows = decisions.filter(**{f"{kind}__in": list(ids)}, id=Subquery(latest))
    return {getattr(r, f"{kind}_id"): r for r in rows.select_related("author")}


def review_state(subject: Model) -> Review | None:
    """The latest approval or change request of one subject."""
    return review_states(subjects=[subject]).get(subject.pk)
