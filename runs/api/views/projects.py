"""/api/v1/projects/ and /api/v1/saved-views/: the projects one is a member of (and creating one), a
project's members (its owners and staff change them), the saved views of the runs list one finds (and
saving one). Thin: parse, call a selector or a service, answer."""
from __future__ import annotations

from rest_framework import serializers
from rest_framework.response import Response

from runs.api.base import ApiView, created, error_response
from runs.projects import selectors as project_selectors, services as project_services
from runs.saved_views import selectors as view_selectors, services as view_services


class ProjectSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="unique; you become its owner")


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField(help_text="an existing user's username")
    role = serializers.CharField(help_text="viewer, editor or owner")


class SavedViewSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="the view's name; one you used already is replaced")
    params = serializers.DictField(help_text="the runs list's parameters (GET /api/v1/runs/'s): filters, columns, "
                                             "sort, e.g. {\"tag\": \"baseline\", \"sort\": \"-tau\"}")
    project = serializers.CharField(required=False, allow_blank=True, help_text="a project you are a member of")
    shared = serializers.BooleanField(required=False, default=False,
                                      help_text="every member of `project` finds it in their menu")


class ProjectList(ApiView):
    request_serializers = {"POST": ProjectSerializer}
    responses = {"GET": {"200": "{results: [{id, name, open_to_all, role, runs}]}"},
                 "POST": {"201": "the project, with you as its owner"}}

    def get(self, request):
        """The projects whose runs you see, your role in each (null: staff who are not a member) and how
        many runs each holds (archived ones left out)."""
        return Response({"results": project_selectors.project_list(user=request.user)})

    def post(self, request):
        """Create a project (members only; the launcher or admin role may): you own it."""
        project = project_services.project_create(user=request.user, name=self.body()["name"])
        found = next(p for p in project_selectors.project_list(user=request.user) if p["id"] == project.pk)
        return created(found)


def _members_answer(project) -> dict:
    return {"project": project.pk, "name": project.name, "open_to_all": project.open_to_all,
            "results": project_selectors.project_members(project=project)}


class ProjectMembers(ApiView):
    request_serializers = {"POST": MemberSerializer}
    responses = {"GET": {"200": "{project, name, open_to_all, results: [{username, role}]}",
                         "404": "no project you see with this id"},
                 "POST": {"200": "the members, as GET answers them, with the user's role set",
                          "403": "you are not an owner of the project (nor staff)"}}

    def get(self, request, pk: int):
        """The project's members and their roles (an open project's other signed-in users are not listed:
        they see its runs by their site roles)."""
        return Response(_members_answer(project_selectors.project_get(pk=pk, user=request.user)))

    def post(self, request, pk: int):
        """Add a user to the project by username, or change their role (its owners and staff only)."""
        body = self.body()
        project = project_selectors.project_get(pk=pk, user=request.user)
        project_services.project_member_set(project=project, user=request.user, username=body["username"],
                                            role=body["role"])
        return Response(_members_answer(project))


class ProjectMemberDetail(ApiView):
    responses = {"DELETE": {"204": "removed", "404": "no such project you see, or the user is not a member",
                            "403": "you are not an owner of the project (nor staff)"}}

    def delete(self, request, pk: int, username: str):
        """Remove a member from the project (its owners and staff only); its last owner stays."""
        project = project_selectors.project_get(pk=pk, user=request.user)
        if not project_services.project_member_set(project=project, user=request.user, username=username, role=None):
            return error_response(f"{username[:50]} is not a member of project {project.name}", code=404)
        return Response(status=204)


class SavedViewList(ApiView):
    request_serializers = {"POST": SavedViewSerializer}
    responses = {"GET": {"200": "{results: [{id, name, params, owner, project, shared, created_at}]}"},
                 "POST": {"201": "the saved view; open it on the runs page with ?view=<id>"}}

    def get(self, request):
        """Your saved views and those shared with your projects."""
        return Response({"results": [view_selectors.saved_view_dict(v)
                                     for v in view_selectors.saved_views_for(user=request.user)]})

    def post(self, request):
        """Save a view of the runs list; its params are checked as the list checks them (400 naming them)."""
        body = self.body()
        view = view_services.saved_view_save(user=request.user, name=body["name"], params=body["params"],
                                             project_name=body.get("project", ""), shared=body["shared"])
        return created(view_selectors.saved_view_dict(view))
