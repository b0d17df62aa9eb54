"""The projects pages' forms: a new project or a new name, a member by username and role, runs moved in."""
from django import forms

from runs.projects.models import ProjectMember


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150, help_text="an existing user's username")
    role = forms.ChoiceField(choices=ProjectMember.Role.choices, initial=ProjectMember.Role.VIEWER,
                             help_text="viewer: sees the runs; editor: launches too; owner: manages the members")


class ProjectNameForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="unique; at most 100 characters")


class MoveRunsForm(forms.Form):
    ids = forms.CharField(max_length=2000, label="Run ids", help_text=(
        "comma-separated, e.g. 12, 14: runs you may change, moved into this project"))
