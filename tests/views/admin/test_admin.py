import re

import pytest
from django.contrib import admin
from django.urls import reverse

from runs.models import (AlertRule, Checkpoint, Dataset, Extraction, MetricSeries, PipelineRun, Project, ProjectMember,
                         Report, SavedView, TargetModel, Verification)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("model", [TargetModel, Dataset, PipelineRun, Extraction, Checkpoint, MetricSeries, Verification,
                                   AlertRule, Report, Project, ProjectMember, SavedView])
def test_staff_can_open_each_admin_list_with_filters_and_search(admin_client, model):
    assert model in admin.site._registry
    url = reverse(f"admin:runs_{model._meta.model_name}_changelist")
    response = admin_client.get(url, {"q": "llama"})
    assert response.status_code == 200


def test_every_runs_model_is_in_the_admin():
    from django.apps import apps

    missing = [m.__name__ for m in apps.get_app_config("runs").get_models() if m not in admin.site._registry]
    assert missing == []


def test_a_runs_config_is_read_only_in_the_admin(admin_client, user, roots):
    """Its settings were checked at launch; an edit here would skip every check (launch a copy instead)."""
    from runs.pipeline import services
    from runs.pipeline.launch.run_config import RunConfig

    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64))
    url = reverse("admin:runs_pipelinerun_change", args=[run.pk])
    page = admin_client.get(url).content.decode()
    assert 'name="config"' not in page and "transformers" in page  # shown, not editable
    # Submit the page as a browser would (its inlines' management forms included), config added.
    form = dict(re.findall(r'<input type="(?:hidden|text|number)" name="([^"]+)" value="([^"]*)"', page))
    selects = re.findall(r'<select name="([^"]+)"[^>]*>.*?<option value="([^"]*)" selected>', page, flags=re.S)
    response = admin_client.post(url, {**form, **dict(selects), "name": "renamed",
                                       "config": '{"extraction_backend": "vLLM"}'})
    run.refresh_from_db()
    assert response.status_code == 302 and run.name == "renamed"  # the rest of the run still saves
    assert run.config["extraction_backend"] == "transformers"


def test_staff_add_a_project_and_its_members_in_the_admin(admin_client, admin_user):
    """Where staff manage membership today: a project with a member, made on one page; a name another
    project has, whatever its case, is refused at its field (as the API refuses it)."""
    from runs.projects.models import DEFAULT_PROJECT_NAME

    Project.objects.get_or_create(name=DEFAULT_PROJECT_NAME, defaults={"open_to_all": True})
    url = reverse("admin:runs_project_add")
    inline = {"members-TOTAL_FORMS": "1", "members-INITIAL_FORMS": "0", "members-0-user": str(admin_user.pk),
              "members-0-role": "owner"}
    response = admin_client.post(url, {"name": "  vision   drafts ", **inline})
    assert response.status_code == 302
    project = Project.objects.get(name="vision drafts")
    assert list(ProjectMember.objects.filter(project=project).values_list("user__username", "role")) == [
        (admin_user.username, "owner")]
    response = admin_client.post(url, {"name": DEFAULT_PROJECT_NAME.upper(), **inline})
    assert response.status_code == 200 and "exists already" in response.content.decode()
    assert Project.objects.filter(name__iexact=DEFAULT_PROJECT_NAME).count() == 1
