"""Curating a dataset's samples in the admin: excluded samples are skipped by later preparations."""
import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from runs.pipeline import services
from runs.models import CurationAction, DatasetSample, Preparation
from runs.pipeline.launch.run_config import RunConfig
from workers.orchestration.tasks import stage_execute

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator(client):
    user = get_user_model().objects.create_superuser("curator", password="pw-curator-1")
    client.login(username="curator", password="pw-curator-1")
    return user


def registered_and_catalogued(path):
    """Register the dataset, then run the catalogue job it queued the way a worker does."""
    dataset = services.dataset_register(path=path)
    catalogue = dataset.catalogues.get(status="queued")
    assert stage_execute(stage_name="catalogue", record_id=catalogue.pk, worker="test")
    return dataset


def test_registering_a_dataset_catalogues_each_conversation(tiny_target):
    dataset = services.dataset_register(path=tiny_target.chats_path)
    assert dataset.samples.count() == 0  # the request only checked the head of the file; a worker reads it all
    dataset = registered_and_catalogued(tiny_target.chats_path)
    assert dataset.samples.count() == tiny_target.num_conversations
    catalogue = dataset.catalogues.get()
    assert (catalogue.status, catalogue.samples_added, catalogue.samples_total) == (
        "succeeded", tiny_target.num_conversations, tiny_target.num_conversations)
    assert catalogue.progress_done == catalogue.progress_total == 2 * dataset.size_bytes
    sample = dataset.samples.first()
    assert sample.num_turns >= 1 and sample.preview


def test_admin_exclude_action_logs_who_and_which(client, curator, tiny_target):
    dataset = registered_and_catalogued(tiny_target.chats_path)
    chosen = list(dataset.samples.order_by("line").values_list("pk", flat=True)[:3])
    response = client.post(reverse("admin:runs_datasetsample_changelist"),
                           {"action": "exclude_samples", "_selected_action": chosen}, follow=True)
    assert b"Excluded 3 sample(s)" in response.content
    assert DatasetSample.objects.filter(excluded=True).count() == 3
    log = CurationAction.objects.get()
    assert log.user == curator and log.action == "exclude" and len(log.sample_ids) == 3


def test_admin_search_and_length_filter_answer(client, curator, tiny_target):
    registered_and_catalogued(tiny_target.chats_path)
    url = reverse("admin:runs_datasetsample_changelist")
    assert client.get(url, {"q": "demo-00001"}).status_code == 200
    assert client.get(url, {"length": "short", "excluded__exact": "0"}).status_code == 200


def test_a_preparation_skips_excluded_samples(tiny_target, curator, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = services.run_launch(user=curator, target_path=tiny_target.target_dir,
                                  dataset_path=tiny_target.chats_path, config=RunConfig(max_seq_len=256))
    assert stage_execute(stage_name="catalogue", record_id=run.dataset.catalogues.get().pk, worker="test")
    DatasetSample.objects.filter(pk__in=list(run.dataset.samples.values_list("pk", flat=True)[:10])).update(excluded=True)
    assert stage_execute(stage_name="prepare", record_id=run.preparation.pk, worker="test")
    preparation = Preparation.objects.get(run=run)
    assert preparation.num_conversations == tiny_target.num_conversations - 10
    assert preparation.num_excluded == 10


def test_dataset_page_counts_excluded_samples(client, curator, tiny_target):
    dataset = registered_and_catalogued(tiny_target.chats_path)
    dataset.samples.filter(pk__in=list(dataset.samples.values_list("pk", flat=True)[:4])).update(excluded=True)
    response = client.get(dataset.get_absolute_url())
    assert f"{tiny_target.num_conversations} conversations, 4 excluded".encode() in response.content
