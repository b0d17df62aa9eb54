"""Which saved views a user finds: their own, and those shared with a project they are a member of."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet
from django.http import Http404, QueryDict

from runs.saved_views.models import SavedView
from runs.projects import access


def saved_views_for(*, user: AbstractBaseUser, visible: list[int] | None = ...) -> QuerySet[SavedView]:
    """The user's views and the shared views of their projects (staff: of every project), by name; one query.
    `visible`: the user's access.visible_project_ids when the caller read them already."""
    if not user.is_authenticated:
        return SavedView.objects.none()
    if visible is ...:
        visible = access.visible_project_ids(user)
    return SavedView.objects.filter(views_found(user=user, visible=visible)).select_related(
        "owner", "project").order_by("name", "id")


def views_found(*, user: AbstractBaseUser | int, visible) -> Q:
    """The views `user` (the user or their id) finds: their own, and the shared views of the projects
    `visible` (ids, or a query of them; None: every project)."""
    shared = Q(shared=True)
    if visible is not None:
        shared &= Q(project_id__in=visible)
    return Q(owner=user) | shared


def saved_view_get(*, user: AbstractBaseUser, pk: int) -> SavedView:
    """One view the user finds; Http404 for any other (it is not theirs to read)."""
    view = saved_views_for(user=user).filter(pk=pk).first()
    if view is None:
        raise Http404(f"no saved view {pk}")
    return view


def view_query(view: SavedView, params: QueryDict | None = None) -> QueryDict:
    """The runs list's parameters with the view applied: the view's, then what the request adds or changes
    (a page, a sort clicked on a column header); `view` itself is dropped."""
    query = QueryDict(mutable=True)
    for key, value in view.params.items():
        query[key] = value
    for key, values in (params or QueryDict()).lists():
        if key != "view":
            query.setlist(key, values)
    return query


def saved_view_dict(view: SavedView) -> dict:
    return {"id": view.pk, "name": view.name, "params": view.params, "owner": view.owner.get_username(),
            "project": view.project.name if view.project_id else None, "shared": view.shared,
            "created_at": view.created_at.isoformat()}
