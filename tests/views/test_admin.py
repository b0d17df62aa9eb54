import pytest
from django.contrib import admin
from django.urls import reverse

from runs.models import Checkpoint, Dataset, Extraction, MetricSeries, PipelineRun, TargetModel, Verification

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("model", [TargetModel, Dataset, PipelineRun, Extraction, Checkpoint, MetricSeries, Verification])
def test_staff_can_open_each_admin_list_with_filters_and_search(admin_client, model):
    assert model in admin.site._registry
    url = reverse(f"admin:runs_{model._meta.model_name}_changelist")
    response = admin_client.get(url, {"q": "llama"})
    assert response.status_code == 200


def test_every_runs_model_is_in_the_admin():
    from django.apps import apps

    missing = [m.__name__ for m in apps.get_app_config("runs").get_models() if m not in admin.site._registry]
    assert missing == []
