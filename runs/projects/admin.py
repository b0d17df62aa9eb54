"""Projects and their members in the admin (runs/admin.py imports this). Staff manage a
project's membership and roles here (the site has no members page yet): projects and members have Add."""
from django import forms
from django.contrib import admin

from runs.projects.models import Project, ProjectMember
from runs.projects.services import ProjectError, check_project_name


class ProjectForm(forms.ModelForm):
    class Meta:
        model = Project
        fields = ("name", "open_to_all", "created_by")

    def clean_name(self):
        # As the API checks a new project's name: trimmed, printable, unique whatever its case.
        try:
            name = check_project_name(self.cleaned_data.get("name"))
        except ProjectError as error:
            raise forms.ValidationError(str(error)) from error
        taken = Project.objects.filter(name__iexact=name).exclude(pk=self.instance.pk)
        if taken.exists():
            raise forms.ValidationError(f"a project named {name!r} exists already")
        return name


class ProjectMemberInline(admin.TabularInline):
    model = ProjectMember
    extra = 1
    autocomplete_fields = ("user",)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    form = ProjectForm
    list_display = ("name", "open_to_all", "created_by", "created_at")
    list_filter = ("open_to_all",)
    list_select_related = ("created_by",)
    search_fields = ("name",)
    inlines = [ProjectMemberInline]


@admin.register(ProjectMember)
class ProjectMemberAdmin(admin.ModelAdmin):
    list_display = ("project", "user", "role")
    list_filter = ("role", "project")
    list_select_related = ("project", "user")
    search_fields = ("project__name", "user__username")
    autocomplete_fields = ("user",)

