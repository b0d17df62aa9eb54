"""The project page's form: add a member by username, or change one's role."""
from django import forms

from runs.projects.models import ProjectMember


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150, help_text="an existing user's username")
    role = forms.ChoiceField(choices=ProjectMember.Role.choices, initial=ProjectMember.Role.VIEWER,
                             help_text="viewer: sees the runs; editor: launches too; owner: manages the members")
