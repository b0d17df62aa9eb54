"""The online cache's size setting is named for what it counts, GiB (2**30 bytes): hidden_states_cache_gib.
The old name, hidden_states_cache_gb, is refused wherever a user can still type it (API body, run_pipeline
flag, the runs list's setting filter) with an error naming the new one and nothing stored; configs stored
under the old name are renamed by migration 0021, value unchanged, and still count GiB."""
from __future__ import annotations

import importlib
from urllib.parse import urlencode

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.http import QueryDict

from runs.models import PendingEnqueue, PipelineRun, SavedView, Sweep
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.runs_list.run_filters import RunTableError, RunFilters
from workers.orchestration.online_tasks import online_source

pytestmark = pytest.mark.django_db

renaming = importlib.import_module("runs.migrations.0021_hidden_states_cache_gib")
URLS = ["http://10.0.0.7:8000"]


def stored() -> tuple[int, int]:
    return PipelineRun.objects.count(), PendingEnqueue.objects.count()


def test_the_api_refuses_the_old_name_naming_the_new_one_and_stores_nothing(api, roots):
    before = stored()
    response = api("launcher").post("/api/v1/runs/", {
        "target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "hidden_states": "online",
        "capture_servers": 0, "capture_urls": URLS, "hidden_states_cache_gb": 2})
    assert response.status_code == 400
    assert response.json()["fields"]["hidden_states_cache_gb"] == (
        "hidden_states_cache_gb was renamed hidden_states_cache_gib: it counts GiB (2**30 bytes), not GB; "
        "give hidden_states_cache_gib")
    assert stored() == before


def test_run_pipeline_refuses_the_old_flag_naming_the_new_one(people, roots):
    before = stored()
    with pytest.raises(CommandError, match="--hidden-states-cache-gb was renamed --hidden-states-cache-gib: it "
                                           r"counts GiB \(2\*\*30 bytes\)"):
        call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                     "--hidden-states", "online", "--capture-servers", "0", "--capture-url", URLS[0],
                     "--hidden-states-cache-gb", "2", "--user", people["launcher"][0].username)
    assert stored() == before


def test_the_runs_list_filter_names_the_new_setting():
    with pytest.raises(RunTableError, match="hidden_states_cache_gb was renamed hidden_states_cache_gib"):
        RunFilters.from_query(QueryDict("settings=hidden_states_cache_gb%3D0.5"))


def test_stored_configs_are_renamed_with_their_value_which_still_counts_gib(people, roots,
                                                                          django_capture_on_commit_callbacks):
    user = people["launcher"][0]
    with django_capture_on_commit_callbacks(execute=False):
        run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                  config=RunConfig(hidden_states="online", capture_servers=0, capture_urls=URLS,
                                                   hidden_states_cache_gib=0.5))
    old_config = {("hidden_states_cache_gb" if k == "hidden_states_cache_gib" else k): v for k, v in run.config.items()}
    PipelineRun.objects.filter(pk=run.pk).update(config=old_config)  # as a run launched before the rename stored it
    sweep = Sweep.objects.create(owner=user, name="s", varied=[["lr", ["1e-4"]]],
                                 base={"target_path": "t", "dataset_path": "d", "config": old_config})
    view = SavedView.objects.create(owner=user, name="v", params={
        "settings": "epochs=2; hidden_states_cache_gb=0.5", "setting.hidden_states_cache_gb": "0.5", "sort": "tau"})

    renaming.forward(apps, None)
    run.refresh_from_db(), sweep.refresh_from_db(), view.refresh_from_db()
    assert "hidden_states_cache_gb" not in run.config and run.config["hidden_states_cache_gib"] == 0.5
    assert set(run.config) == set(old_config) - {"hidden_states_cache_gb"} | {"hidden_states_cache_gib"}
    assert sweep.base["config"] == run.config
    assert view.params == {"settings": "epochs=2; hidden_states_cache_gib=0.5",
                           "setting.hidden_states_cache_gib": "0.5", "sort": "tau"}
    RunFilters.from_query(QueryDict(urlencode(view.params)))  # the saved view opens again
    assert online_source(run).cache_bytes == 2**29  # half a GiB, as before the rename

    renaming.backward(apps, None)
    run.refresh_from_db(), view.refresh_from_db()
    assert run.config == old_config and view.params["setting.hidden_states_cache_gb"] == "0.5"
