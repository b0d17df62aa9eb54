"""Saving a view of the runs list, and deleting one; who may see one is runs.saved_views.selectors'."""
from __future__ import annotations

import unicodedata

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from runs.projects.models import Project, ProjectMember
from runs.saved_views.models import SavedView
from runs.projects import access
from runs.saved_views.models import MAX_VIEW_NAME_CHARS
from runs.tracking.runs_list import run_filters
from workers.contract.errors import InputError

MAX_VIEWS_PER_USER = 200


class SavedViewError(InputError):
    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


def view_params(params) -> dict[str, str]:
    """The runs list parameters a view keeps (its filters, columns and sort; never a page), checked as the
    list checks them: an unknown parameter or a bad value is refused naming it (field `params`)."""
    kept: dict[str, str] = {}
    for key in params:
        if key in ("page", "view"):
            continue
        if key not in run_filters.PARAMS and not key.startswith(run_filters.SETTING_PREFIX):
            raise SavedViewError(f"params: unknown parameter {str(key)[:40]!r} (known: {', '.join(run_filters.PARAMS)}, "
                                 f"{run_filters.SETTING_PREFIX}<setting>)", field="params")
        value = ",".join(params.getlist(key)) if hasattr(params, "getlist") else params.get(key)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise SavedViewError(f"params: {key} must be text or a number", field="params")
        if str(value).strip():
            kept[str(key)] = str(value).strip()
    try:
        run_filters.RunFilters.from_query(kept)
    except run_filters.RunTableError as exc:
        raise SavedViewError(f"params: {exc}", field="params") from None
    return kept


def _name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise SavedViewError("name: give the view a name", field="name")
    name = " ".join(name.split())
    if len(name) > MAX_VIEW_NAME_CHARS:
        raise SavedViewError(f"name is {len(name)} characters long; at most {MAX_VIEW_NAME_CHARS}", field="name")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in name):
        raise SavedViewError("name holds control or unassigned characters", field="name")
    return name


@transaction.atomic
def saved_view_save(*, user: AbstractBaseUser, name: str, params, project_name: str = "",
                    shared: bool = False) -> SavedView:
    """Save (or, under a name the user used already, replace) a view of the runs list. Shared views are
    shared with a project the user is a member of; every member then finds it in their menu."""
    name = _name(name)
    kept = view_params(params)
    project = None
    if project_name:
        project = Project.objects.filter(name=str(project_name)[:200]).first()
        if project is None or not access.has_role(user, project, ProjectMember.Role.VIEWER):
            raise SavedViewError(f"project: there is no project {str(project_name)[:50]!r} you are a member of",
                                 field="project")
    if shared and project is None:
        raise SavedViewError("project: a shared view is shared with a project's members: name the project",
                             field="project")
    existing = SavedView.objects.filter(owner=user, name=name).first()
    if existing is None and SavedView.objects.filter(owner=user).count() >= MAX_VIEWS_PER_USER:
        raise SavedViewError(f"name: you have {MAX_VIEWS_PER_USER} saved views; delete one first", field="name")
    view = existing or SavedView(owner=user, name=name)
    view.params, view.project, view.shared = kept, project, bool(shared)
    view.save()
    return view


@transaction.atomic
def saved_view_delete(*, user: AbstractBaseUser, view: SavedView) -> None:
    if view.owner_id != user.pk:
        raise SavedViewError(f"the view {view.name!r} is {view.owner.get_username()}'s: only they may delete it")
    view.delete()
