"""One run's row where the user sees it, in a statement compiled once: what every poll and curve read asks
first (runs.pipeline.status.changes.run_counters, runs.tracking.curves.curve_owner).

The statement is the ORM's own, `access.runs_visible(apps.get_model("runs", "PipelineRun").objects.filter(pk=...), user)` reading
`fields`, so the project rule stays the one in runs.projects.access. It is compiled once per fields and per
kind of user (one who sees every project; any other signed-in user, the rule then naming them by id alone),
with stand-in ids that the request's run and user then replace: building and compiling it took several times
what PostgreSQL took to answer it (issue 40)."""
from __future__ import annotations

from functools import lru_cache

from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import EmptyResultSet
from django.db import connections

from runs.projects import access

# Ids no row has (both are negative): in the compiled statement's parameters, where the run's and the user's go.
RUN_STAND_IN, USER_STAND_IN = -7_700_000_000_000_001, -7_700_000_000_000_002


@lru_cache(maxsize=32)
def _statement(fields: tuple[str, ...], sees_every_project: bool) -> tuple[str, str, tuple]:
    stand_in = get_user_model()(pk=USER_STAND_IN, is_staff=sees_every_project)
    runs = apps.get_model("runs", "PipelineRun").objects.filter(pk=RUN_STAND_IN)
    rows = access.runs_visible(runs, stand_in).values_list(*fields)[:1]
    sql, params = rows.query.sql_with_params()
    slots = tuple("run" if p == RUN_STAND_IN else "user" if p == USER_STAND_IN else ("value", p) for p in params)
    if slots.count("run") != 1 or ("user" in slots) == sees_every_project:
        raise AssertionError(f"the visible run's statement names the run or user unexpectedly: {sql}")
    return rows.db, sql, slots


def visible_run_row(*, run_id: int, user: AbstractBaseUser, fields: tuple[str, ...]) -> tuple | None:
    """`fields` of the run, or None when there is no such run or its project is not one the user sees (an
    anonymous user sees none)."""
    if not user.is_authenticated or not 0 < run_id < 2**63:
        return None
    try:
        database, sql, slots = _statement(fields, access.sees_every_project(user))
    except EmptyResultSet:  # a rule that matches nothing for such a user
        return None
    params = [run_id if slot == "run" else user.pk if slot == "user" else slot[1] for slot in slots]
    with connections[database].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()
