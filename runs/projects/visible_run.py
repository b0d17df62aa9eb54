"""One run's row where the user sees it, in a statement compiled once: what every poll and curve read asks
first (runs.pipeline.status.changes.run_counters, runs.tracking.curves.curve_owner).

The statement is the ORM's own, `access.runs_visible(apps.get_model("runs", "PipelineRun").objects.filter(pk=...), user)` reading
`fields`, so the project rule stays the one in runs.projects.access. It is compiled once per fields and per
kind of user (one who sees every project; any other signed-in user, the rule then naming them by id alone),
with stand-in ids that the request's run and user then replace (eagle3web.db)."""
from __future__ import annotations

from functools import lru_cache

from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import EmptyResultSet

from eagle3web.db import CompiledQuery, compile_query, stand_in
from runs.projects import access


@lru_cache(maxsize=32)
def _statement(fields: tuple[str, ...], sees_every_project: bool) -> CompiledQuery:
    user = get_user_model()(pk=stand_in(1), is_staff=sees_every_project)
    runs = apps.get_model("runs", "PipelineRun").objects.filter(pk=stand_in(0))
    rows = access.runs_visible(runs, user).values_list(*fields)[:1]
    # The rule names a user who does not see every project by id, once; one who does, not at all.
    return compile_query(rows, run=stand_in(0), **({} if sees_every_project else {"user": stand_in(1)}))


def visible_run_row(*, run_id: int, user: AbstractBaseUser, fields: tuple[str, ...]) -> tuple | None:
    """`fields` of the run, or None when there is no such run or its project is not one the user sees (an
    anonymous user sees none)."""
    if not user.is_authenticated or not 0 < run_id < 2**63:
        return None
    try:
        statement = _statement(fields, access.sees_every_project(user))
    except EmptyResultSet:  # a rule that matches nothing for such a user
        return None
    return statement.fetch_one(run=run_id, user=user.pk)
