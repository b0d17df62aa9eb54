"""A project's page: its members and roles, and for its owners (and staff) a form to add, change and remove
them. Thin: a selector or a service, then render; /api/v1/projects/<id>/members/ does the same for scripts."""
from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from runs.projects import access, selectors, services
from runs.projects.forms import MemberForm
from runs.projects.models import ProjectMember


def project_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the members. POST `username` and `role`: set that user's role; POST `remove`: remove them.
    A project the user does not see is a 404; a change by someone who is not its owner (nor staff) a 403."""
    project = selectors.project_get(pk=pk, user=request.user)
    may_manage = access.sees_every_project(request.user) or access.has_role(request.user, project,
                                                                             ProjectMember.Role.OWNER)
    if request.method == "POST" and not may_manage:
        raise PermissionDenied(f"{request.user.get_username()} may not change the members of project {project.name}: "
                               "only its owners and staff may")
    form = MemberForm(request.POST if request.method == "POST" and "remove" not in request.POST else None)
    remove_error = ""
    if request.method == "POST":
        if "remove" in request.POST:
            username = request.POST["remove"]
            try:
                removed = services.project_member_set(project=project, user=request.user, username=username, role=None)
            except services.ProjectError as exc:
                remove_error = str(exc)
            else:
                messages.info(request, f"Removed {username} from {project.name}." if removed
                              else f"{username} was not a member of {project.name}.")
                return redirect("runs:project_detail", pk=project.pk)
        elif form.is_valid():
            try:
                services.project_member_set(project=project, user=request.user,
                                            username=form.cleaned_data["username"], role=form.cleaned_data["role"])
            except services.ProjectError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            else:
                messages.success(request, f"{form.cleaned_data['username']} is now {form.cleaned_data['role']} "
                                          f"of {project.name}.")
                return redirect("runs:project_detail", pk=project.pk)
    return render(request, "runs/project_detail.html", {
        "project": project, "members": selectors.project_members(project=project), "form": form,
        "may_manage": may_manage, "remove_error": remove_error}, status=400 if form.errors or remove_error else 200)
