"""`Idempotency-Key` on POST /api/v1/runs/: a launch (or an external run's create) sent again with the same
key and body within a day answers the run the first one made, so a client whose answer was lost may send
it again without launching twice.

One row per user and key (runs.api.models.LaunchIdempotencyKey). The request claims the key by inserting
its row, launches, and stores the run on it, all in one transaction: a second request with the key
waits at its own insert (the unique constraint) until the first commits, then answers the first's run;
if the first was refused (rolled back, row and all) the second launches. A row past its day is locked
(select_for_update), given the new run and the new time."""
from __future__ import annotations

import hashlib
import json
import unicodedata
from datetime import timedelta
from typing import Callable

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.response import Response

from runs.api import shapes
from runs.api.shapes import run_answer
from runs.api.base import ApiInputError, error_response
from runs.api.models import IDEMPOTENCY_KEY_MAX_CHARS, LaunchIdempotencyKey

HEADER = "Idempotency-Key"
META_NAME = "HTTP_IDEMPOTENCY_KEY"
LIFETIME = timedelta(hours=24)
# How often a claim is tried again when the row it waited on is gone by the time it reads it (its run was
# deleted just then): each try either claims the key or finds a committed row.
CLAIM_TRIES = 3


class KeyConflict(Exception):
    """The key was used within its day with another body."""


class _NotLaunched(Exception):
    """`launch` answered without making a run: its answer stands, the claim is rolled back."""

    def __init__(self, answer: Response):
        self.answer = answer


def key_from(request) -> str | None:
    """The request's Idempotency-Key (None when not sent); a 400 naming the header when it is empty,
    longer than the column, or holds a control character (a header a proxy could split or log oddly)."""
    key = request.META.get(META_NAME)
    if key is None:
        return None
    if not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX_CHARS:
        raise ApiInputError(f"{HEADER} must be 1 to {IDEMPOTENCY_KEY_MAX_CHARS} characters, got {len(key)} "
                            "(a uuid4 is 36)", field=HEADER)
    bad = next((c for c in key if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise ApiInputError(f"{HEADER} may not hold control characters, got {bad!r}", field=HEADER)
    return key


def body_sha256(data) -> str:
    """The body's SHA-256 as canonical JSON (sorted keys, no spaces): the same body sent by another
    client library, its keys in another order, is the same body."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _claim(*, user, key: str, digest: str) -> tuple[LaunchIdempotencyKey, bool]:
    """The key's row, locked until the caller's transaction ends, and whether this request is to launch
    (the key is new here, or its row is past its day)."""
    for _ in range(CLAIM_TRIES):
        row = LaunchIdempotencyKey.objects.select_for_update().filter(user=user, key=key).first()
        if row is None:
            try:
                with transaction.atomic():  # a savepoint: a lost race leaves the caller's transaction usable
                    return LaunchIdempotencyKey.objects.create(user=user, key=key, body_sha256=digest), True
            except IntegrityError:
                continue  # another request claimed it and has committed by now: read its row
        return row, row.created_at <= timezone.now() - LIFETIME
    raise RuntimeError(f"{HEADER} {key[:40]!r} of {user} could not be claimed in {CLAIM_TRIES} tries")


def launch_once(*, user, key: str, data, launch: Callable[[], Response]) -> tuple[int, Response | None]:
    """(the run's id, `launch`'s answer when it made the run now, else None). `launch` answers 201 with the
    run (`id` in its data); it runs only when the key is new or past its day, and anything it raises, or any
    other answer, rolls the claim back with it. KeyConflict when the key's fresh row holds another body."""
    digest = body_sha256(data)
    with transaction.atomic():
        row, launching = _claim(user=user, key=key, digest=digest)
        if not launching:
            if row.body_sha256 != digest:
                raise KeyConflict(f"{HEADER} {key[:40]!r} was used at {row.created_at.isoformat()} with another "
                                  f"body (it launched run {row.run_id}); send a new key for a new launch")
            return row.run_id, None
        answer = launch()
        if answer.status_code != 201:
            raise _NotLaunched(answer)
        row.run_id, row.body_sha256, row.created_at = answer.data["id"], digest, timezone.now()
        row.save(update_fields=["run", "body_sha256", "created_at"])
        return row.run_id, answer


def answer_once(request, *, launch: Callable[[], Response]) -> Response:
    """RunList.post's answer: `launch()` as it is without a key; with one, its first answer (201) or, for a
    repeat within the day, 200 with the same run as it is now and `Idempotent-Replayed: true`; 409 for a
    repeat with another body."""
    key = key_from(request)
    if key is None:
        return launch()
    try:
        run_id, first = launch_once(user=request.user, key=key, data=request.data, launch=launch)
    except KeyConflict as exc:
        return error_response(str(exc), code=409, fields={HEADER: str(exc)})
    except _NotLaunched as not_launched:
        return not_launched.answer
    if first is not None:
        return first
    return Response(run_answer(run_id, request), headers={
        "Location": shapes.api_url(request, "run_detail", run_id), "Idempotent-Replayed": "true"})
