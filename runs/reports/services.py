"""Writing reports: creating one (its version 1) and saving it again (a new version; the old ones stay
as they were). Any signed-in user may write a report of their own; only its author and staff save
another version of it."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runs.reports.models import Report, ReportVersion
from runs.reports.models import MAX_BODY_CHARS, MAX_TITLE_CHARS
from workers.contract.errors import InputError


class ReportError(InputError):
    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


def report_check(*, title: object, body: object) -> tuple[str, str]:
    """The title and body as stored, or ReportError naming the field."""
    if not isinstance(title, str) or not title.strip():
        raise ReportError("title: give the report a title", field="title")
    title = title.strip()
    if len(title) > MAX_TITLE_CHARS:
        raise ReportError(f"title is {len(title):,} characters long; at most {MAX_TITLE_CHARS}", field="title")
    if any(ord(c) < 32 for c in title):
        raise ReportError("title may not hold control characters (line breaks, tabs)", field="title")
    if not isinstance(body, str):
        raise ReportError("body must be text (Markdown)", field="body")
    if len(body) > MAX_BODY_CHARS:
        raise ReportError(f"body is {len(body):,} characters long; at most {MAX_BODY_CHARS:,}", field="body")
    if "\x00" in body:
        raise ReportError("body may not hold NUL characters", field="body")
    return title, body


def _require_signed_in(user: AbstractBaseUser) -> None:
    if not user.is_authenticated:
        raise PermissionDenied("sign in to write reports")


@transaction.atomic
def report_create(*, user: AbstractBaseUser, title: str, body: str) -> Report:
    _require_signed_in(user)
    title, body = report_check(title=title, body=body)
    report = Report.objects.create(author=user, title=title, version_count=1)
    ReportVersion.objects.create(report=report, number=1, title=title, body=body, saved_by=user)
    return report


@transaction.atomic
def report_save(*, report: Report, user: AbstractBaseUser, title: str, body: str) -> ReportVersion:
    """A new version of the report, numbered after its newest; refused (PermissionDenied) to anyone but its
    author and staff. Every save is a version, an unchanged one too: the list of versions is the list of saves."""
    _require_signed_in(user)
    if report.author_id != user.pk and not user.is_staff:
        raise PermissionDenied(f"{user.get_username()} may not edit report {report.pk}: only its author "
                               f"({report.author.get_username()}) and staff may")
    title, body = report_check(title=title, body=body)
    # One UPDATE takes the row's lock and counts on from the committed value: two saves get two numbers.
    Report.objects.filter(pk=report.pk).update(version_count=F("version_count") + 1, title=title,
                                               updated_at=timezone.now())
    report.refresh_from_db(fields=["version_count", "title", "updated_at"])
    return ReportVersion.objects.create(report=report, number=report.version_count, title=title, body=body,
                                        saved_by=user)
