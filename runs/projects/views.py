"""The projects pages: the list of those one sees (and a form to create one), and a project's page: its
members and roles, and for its owners (and staff) forms to rename it, add, change and remove members and
move runs into it. Thin: a selector or a service, then render; /api/v1/projects/ does the same for scripts."""
from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from runs.projects import access, bulk, selectors, services
from runs.projects.forms import MemberForm, MoveRunsForm, ProjectNameForm
from runs.projects.models import ProjectMember
from runs.roles import user_can
from workers.contract.errors import InputError


def project_list(request: HttpRequest) -> HttpResponse:
    """GET: the projects one sees, one's role and run count. POST `name`: create one (launchers and admins;
    403 for others), owned by its creator, then its page."""
    form = ProjectNameForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            project = services.project_create(user=request.user, name=form.cleaned_data["name"])
        except services.ProjectError as exc:
            form.add_error("name", str(exc))
        else:
            messages.success(request, f"Created project {project.name}: you own it.")
            return redirect("runs:project_detail", pk=project.pk)
    return render(request, "runs/projects/project_list.html", {
        "projects": selectors.project_list(user=request.user), "form": form,
        "may_create": user_can(request.user, "launch")}, status=400 if form.errors else 200)


# The project page's POST actions, each by the name of its submit button; "remove" names the member.
ACTIONS = ("remove", "rename", "move")


def project_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the members. POST `username` and `role`: set that user's role; `remove`: remove them; `rename`
    with `name`; `move` with `ids`: move those runs into the project. A project the user does not see is a
    404; a change by someone who is not its owner (nor staff) a 403."""
    project = selectors.project_get(pk=pk, user=request.user)
    may_manage = access.sees_every_project(request.user) or access.has_role(request.user, project,
                                                                             ProjectMember.Role.OWNER)
    if request.method == "POST" and not may_manage:
        raise PermissionDenied(f"{request.user.get_username()} may not change project {project.name}: "
                               "only its owners and staff may")
    action = next((a for a in ACTIONS if a in request.POST), "member") if request.method == "POST" else None
    bound = request.POST if action else None
    forms = {"member": MemberForm(bound if action == "member" else None),
             "rename": ProjectNameForm(bound if action == "rename" else None, initial={"name": project.name}),
             "move": MoveRunsForm(bound if action == "move" else None)}
    remove_error = ""
    if action == "remove":
        username = request.POST["remove"]
        try:
            removed = services.project_member_set(project=project, user=request.user, username=username, role=None)
        except services.ProjectError as exc:
            remove_error = str(exc)
        else:
            messages.info(request, f"Removed {username} from {project.name}." if removed
                          else f"{username} was not a member of {project.name}.")
            return redirect("runs:project_detail", pk=project.pk)
    elif action and forms[action].is_valid():
        try:
            done = _act(request, project, action, forms[action].cleaned_data)
        except InputError as exc:
            form = forms[action]
            form.add_error(exc.field if getattr(exc, "field", None) in form.fields else None, str(exc))
        else:
            messages.success(request, done)
            return redirect("runs:project_detail", pk=project.pk)
    failed = remove_error or any(form.errors for form in forms.values())
    return render(request, "runs/projects/project_detail.html", {
        "project": project, "members": selectors.project_members(project=project), "form": forms["member"],
        "rename_form": forms["rename"], "move_form": forms["move"], "may_manage": may_manage,
        "remove_error": remove_error}, status=400 if failed else 200)


def _act(request: HttpRequest, project, action: str, data: dict) -> str:
    """Do the valid form's action; the message to show."""
    if action == "rename":
        old = project.name
        services.project_rename(project=project, user=request.user, name=data["name"])
        return f"Renamed project {old} to {project.name}."
    if action == "move":
        ids = bulk.bulk_ids([data["ids"]])
        moved = bulk.runs_move(user=request.user, run_ids=ids, project=project)
        return f"Moved {moved} run{'s' if moved != 1 else ''} into {project.name}."
    services.project_member_set(project=project, user=request.user, username=data["username"], role=data["role"])
    return f"{data['username']} is now {data['role']} of {project.name}."
