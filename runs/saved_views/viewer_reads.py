"""What the runs list page reads besides its table, in one statement on PostgreSQL (issue 40): the viewer's
projects (runs.projects.access), their saved views (selectors.saved_views_for), the counts other domains show in
the page's frame (FRAME_COUNTS: the bell's unread alerts) and the list's version
(runs.pipeline.status.changes.runs_list_version). Four round trips were each ~0.5-1 ms of a page built afresh.
Each read is its own rule's queryset, an ARRAY (or a count) of the statement, compiled once a process for
members and once for staff; SQLite (the demo) reads each on its own."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import F, Func, JSONField, QuerySet

from eagle3web.db import CompiledQuery, compile_statement, stand_in
from runs.pipeline.status import changes
from runs.projects import access
from runs.projects.models import Project
from runs.saved_views import selectors
from runs.saved_views.models import SavedView

# The columns a saved view is read with: what the page and view_query use (created_at is left deferred).
VIEW_FIELDS = ("id", "owner_id", "name", "params", "project_id", "shared")

# The counts of the viewer's rows that the page's frame shows, by the template's name for them, each a function of
# the user's id to the rows counted: runs/apps.py adds the bell's unread alerts (runs.alerts.selectors), a domain on
# this one's floor that it may not import (tests/house/test_runs_layers.py). A name given to the template
# overrides its context processor's (runs.alerts.context), which then reads nothing.
FRAME_COUNTS: dict[str, Callable[[int], QuerySet]] = {}


def add_frame_count(name: str, rows: Callable[[int], QuerySet]) -> None:
    FRAME_COUNTS[name] = rows
    _compiled.cache_clear()


@dataclass(frozen=True)
class ViewerReads:
    visible: list[int] | None  # access.visible_projects' ids (None: every project)
    project_names: list[str]
    views: list[SavedView]  # with their owner (id and username) and project (id and name)
    counts: dict[str, int]  # FRAME_COUNTS'
    version: str


def _json_rows(rows, *fields):
    """`rows` as one column, each row a JSON array of `fields`: what an ARRAY subquery can hold."""
    return rows.annotate(row=Func(*(F(field) for field in fields), function="json_build_array",
                                  output_field=JSONField())).values_list("row")


@functools.cache
def _compiled(staff: bool) -> CompiledQuery:
    projects = Project.objects.all() if staff else access.projects_seen_by_member(stand_in(0))
    visible = None if staff else access.projects_seen_by_member(stand_in(1)).values("pk")
    views = SavedView.objects.filter(selectors.views_found(user=stand_in(2), visible=visible)).order_by("name", "id")
    username = get_user_model().USERNAME_FIELD
    parts, params = [], []
    reads = [("ARRAY({})", _json_rows(projects.order_by("name"), "pk", "name")),
             ("ARRAY({})", _json_rows(views, *VIEW_FIELDS, f"owner__{username}", "project__name"))]
    reads += [("(SELECT COUNT(*) FROM ({}) AS counted)", rows(stand_in(3 + i)).order_by().values("pk"))
              for i, rows in enumerate(FRAME_COUNTS.values())]
    for template, rows in reads:
        sql, found = rows.query.sql_with_params()
        parts.append(template.format(sql))
        params.extend(found)
    sql = f"SELECT {', '.join(parts)}, version.* FROM ({changes.runs_list_version_sql()}) AS version"
    users = {"views": stand_in(2)} | {f"count_{i}": stand_in(3 + i) for i in range(len(FRAME_COUNTS))}
    if not staff:
        users |= {"projects": stand_in(0), "views_projects": stand_in(1)}
    return compile_statement(sql, tuple(params), database="default", **users)


def _view(values: list, db: str) -> SavedView:
    *fields, username, project_name = values
    view = SavedView.from_db(db, VIEW_FIELDS, fields)
    user_model = get_user_model()
    view.owner = user_model.from_db(db, ("id", user_model.USERNAME_FIELD), (view.owner_id, username))
    view.project = None if view.project_id is None else Project.from_db(db, ("id", "name"), (view.project_id, project_name))
    return view


def viewer_reads(user: AbstractBaseUser) -> ViewerReads:
    """The runs list's reads of a signed-in `user`, and its version."""
    if not user.is_authenticated:  # the page is for signed-in users (LoginRequiredMiddleware); the frame counts nothing
        return ViewerReads(visible=[], project_names=[], views=[], counts={}, version=changes.runs_list_version())
    if connection.vendor != "postgresql":
        visible, names = access.visible_projects(user)
        return ViewerReads(visible=visible, project_names=names,
                           views=list(selectors.saved_views_for(user=user, visible=visible)),
                           counts={name: rows(user.pk).count() for name, rows in FRAME_COUNTS.items()},
                           version=changes.runs_list_version())
    staff = access.sees_every_project(user)
    query = _compiled(staff)
    users = {"views": user.pk} | {f"count_{i}": user.pk for i in range(len(FRAME_COUNTS))}
    if not staff:
        users |= {"projects": user.pk, "views_projects": user.pk}
    projects, views, *rest = query.fetch_one(**users)
    counts, version = rest[:len(FRAME_COUNTS)], rest[len(FRAME_COUNTS):]
    return ViewerReads(visible=None if staff else sorted(pk for pk, _ in projects),
                       project_names=[name for _, name in projects], views=[_view(row, query.database) for row in views],
                       counts=dict(zip(FRAME_COUNTS, counts)), version=changes.runs_list_version_text(version))
