"""The admin as staff use it (issue 28): an index of what they curate, no Add for rows that only
workers and services write, no bulk delete of dataset samples, a curation log that names its samples."""
import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from runs.models import CurationAction, DatasetSample
from runs.pipeline import services
from workers.orchestration.tasks import stage_execute

pytestmark = pytest.mark.django_db

# What staff curate: listed on the index.
CURATED = {
    "auth.user", "auth.group", "runs.targetmodel", "runs.dataset", "runs.datasetsample", "runs.curationaction",
    "runs.pipelinerun", "runs.sweep", "runs.checkpoint", "runs.extraction", "runs.verification",
    "runs.verificationoverride", "runs.review", "runs.runtag", "runs.apitoken", "runs.accountsettings",
    "runs.worker", "runs.pendingenqueue", "runs.apiauditentry", "runs.launchidempotencykey",
    "runs.alertrule", "runs.report", "runs.project", "runs.projectmember", "runs.savedview", "runs.evalsuite",
}
# Rows only workers and services write: off the index, read-only, still open by URL (and deletable).
INTERNAL = {
    "runs.preparation", "runs.extractstage", "runs.vocabmapping", "runs.trainingrun", "runs.stageattempt",
    "runs.datasetcatalogue", "runs.demobuild", "runs.verificationrequest", "runs.servecheck", "runs.datasetregeneration",
    "runs.evaluation", "runs.metricseries", "runs.metricchunk", "runs.manifest", "runs.sweeprun",
    "runs.checkpointgenerations", "runs.alert", "runs.alertnotice", "runs.alertdelivery", "runs.stagewatch",
    "runs.reportversion", "runs.stageshard", "runs.trainingnode",
}
# Listed, with an Add link: what a person makes by hand without breaking anything. Projects and their
# members are where staff manage membership and roles (a project's name is checked as the API checks it).
ADDABLE = {"auth.user", "auth.group", "runs.review", "runs.runtag", "runs.accountsettings", "runs.project",
           "runs.projectmember"}


@pytest.fixture
def curator(client):
    user = get_user_model().objects.create_superuser("curator", password="pw-curator-1")
    client.login(username="curator", password="pw-curator-1")
    return user


def index(client) -> dict[str, dict]:
    response = client.get(reverse("admin:index"))
    assert response.status_code == 200
    return {f"{app['app_label']}.{m['object_name'].lower()}": m for app in response.context["app_list"]
            for m in app["models"]}


def test_the_index_lists_what_staff_curate_and_only_what_they_add_by_hand(client, curator):
    listed = index(client)
    assert CURATED <= set(listed)
    assert not INTERNAL & set(listed), "internal rows on the index"
    # Every registered model is one or the other (axes' sign-in records aside: listed, never added).
    registered = {m._meta.label_lower for m in admin.site._registry}
    assert registered - {l for l in registered if l.startswith("axes.")} == CURATED | INTERNAL
    with_add = {label for label, m in listed.items() if m["add_url"]}
    assert with_add == ADDABLE


@pytest.mark.parametrize("label", sorted(INTERNAL | CURATED - ADDABLE))
def test_a_row_only_services_write_has_no_add_page(client, curator, label):
    app, model = label.split(".")
    assert client.get(reverse(f"admin:{app}_{model}_add")).status_code == 403


@pytest.mark.parametrize("label", sorted(INTERNAL))
def test_an_internal_row_stays_reachable_read_only(client, curator, label):
    app, model = label.split(".")
    assert client.get(reverse(f"admin:{app}_{model}_changelist")).status_code == 200
    model_admin = next(ma for m, ma in admin.site._registry.items() if m._meta.label_lower == label)
    request = client.get(reverse(f"admin:{app}_{model}_changelist")).wsgi_request
    assert not model_admin.has_change_permission(request)
    assert model_admin.has_view_permission(request)


def test_an_outbox_row_can_still_be_deleted(client, curator, user, roots):
    from runs.models import PendingEnqueue
    from runs.pipeline.launch.run_config import RunConfig

    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64))
    row = PendingEnqueue.objects.create(kind="stage", object_id=run.pk)
    url = reverse("admin:runs_pendingenqueue_delete", args=[row.pk])
    assert client.get(url).status_code == 200
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not PendingEnqueue.objects.filter(pk=row.pk).exists()


def catalogued(path):
    dataset = services.dataset_register(path=path)
    assert stage_execute(stage_name="catalogue", record_id=dataset.catalogues.get(status="queued").pk, worker="test")
    return dataset


def test_dataset_samples_cannot_be_bulk_deleted(client, curator, tiny_target):
    """Exclusion is the curation; deleting samples would lose their history."""
    dataset = catalogued(tiny_target.chats_path)
    url = reverse("admin:runs_datasetsample_changelist")
    choices = [name for name, _ in client.get(url).context["action_form"].fields["action"].choices]
    assert "exclude_samples" in choices and "delete_selected" not in choices
    chosen = list(dataset.samples.values_list("pk", flat=True)[:2])
    client.post(url, {"action": "delete_selected", "_selected_action": chosen, "post": "yes"})
    assert DatasetSample.objects.filter(pk__in=chosen).count() == 2


def test_the_curation_log_names_the_samples(client, curator, tiny_target):
    dataset = catalogued(tiny_target.chats_path)
    samples = list(dataset.samples.order_by("line")[:3])
    response = client.post(reverse("admin:runs_datasetsample_changelist"),
                           {"action": "exclude_samples", "_selected_action": [s.pk for s in samples]}, follow=True)
    log = CurationAction.objects.get()
    page = response.content.decode()
    for sample in samples:
        assert sample.sample_id in log.detail
        assert sample.sample_id in page
    assert "Excluded 3 sample(s)" in page


def test_a_long_curation_log_names_the_first_samples_and_counts_the_rest(client, curator, tiny_target):
    from runs.data.curation import NAMED_SAMPLES

    dataset = catalogued(tiny_target.chats_path)
    samples = list(dataset.samples.order_by("line"))
    assert len(samples) > NAMED_SAMPLES + 5
    response = client.post(reverse("admin:runs_datasetsample_changelist"),
                           {"action": "tag_needs_review", "_selected_action": [s.pk for s in samples]}, follow=True)
    log = CurationAction.objects.get()
    rest = len(samples) - NAMED_SAMPLES
    for sample in samples[:NAMED_SAMPLES]:
        assert sample.sample_id in log.detail
    assert samples[NAMED_SAMPLES].sample_id not in log.detail
    assert f"and {rest} more" in log.detail and f"and {rest} more" in response.content.decode()
    assert len(log.sample_ids) == len(samples)  # the full list stays in the log
