"""A file inside a folder a user names (a target's config.json, tokenizer, weights, at any depth) that is a symlink
leading outside EAGLE3WEB_DATA_ROOTS is refused where the folder is named (runs.data.paths), naming the file and
not where it leads: at launch through the API and the form, and by targets/inspect. Nothing is stored. A symlink
staying inside the roots is followed as before. Before, each was followed: the launch answered 201 and inspect
read the outside config.json."""
from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.api.runs.test_api_runs import body, counts

pytestmark = pytest.mark.django_db

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64,
          "vocab_size": 5000}
# What a target folder's names may lead to: each file a loader reads, and a shard in a subfolder.
FILES = {"config.json": json.dumps(CONFIG), "tokenizer.json": "{}", "model.safetensors": "weights",
         "original/consolidated.00.safetensors": "weights"}


@pytest.fixture
def outside(tmp_path):
    """A folder beside the data root (tests/conftest.py's `roots`: tmp_path/data), so outside it."""
    folder = tmp_path / "outside-the-roots"
    folder.mkdir()
    return folder


def linked_out(roots, outside, name: str) -> str:
    """The target folder's `name` made a symlink to a file of the same content outside the roots."""
    (outside / "leak").write_text(FILES[name])
    link = roots / "target" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(outside / "leak")
    return name


def _launch_form(roots) -> dict:
    return {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "layer_ids": "",
            "max_seq_len": 512, "draft_vocab_size": 64, "epochs": 1, "lr": 0.0003, "ttt_steps": 3}


def _says_which_file(message: str, name: str, outside) -> None:
    assert f"{name} is a symlink leading outside the allowed data roots" in message
    assert str(outside) not in message  # where it leads is not told


@pytest.mark.parametrize("name", list(FILES))
def test_a_launch_through_the_api_refuses_a_target_file_linked_outside(api, roots, outside, name):
    linked_out(roots, outside, name)
    before = counts()
    answer = api("launcher").post("/api/v1/runs/", body(roots, draft_vocab_size=64))
    assert answer.status_code == 400 and list(answer.json()["fields"]) == ["target"]
    _says_which_file(answer.json()["fields"]["target"], name, outside)
    assert counts() == before


@pytest.mark.parametrize("name", list(FILES))
def test_the_launch_form_refuses_a_target_file_linked_outside(people, roots, outside, name):
    linked_out(roots, outside, name)
    browser = Client()
    browser.force_login(people["launcher"][0])
    before = counts()
    answer = browser.post("/runs/new/", _launch_form(roots))
    assert answer.status_code == 400
    _says_which_file(answer.content.decode(), name, outside)
    assert counts() == before


@pytest.mark.parametrize("name", list(FILES))
def test_targets_inspect_refuses_a_target_file_linked_outside(api, roots, outside, name):
    linked_out(roots, outside, name)
    answer = api("viewer").get("/api/v1/targets/inspect/", {"path": str(roots / "target")})
    assert answer.status_code == 400 and list(answer.json()["fields"]) == ["path"]
    _says_which_file(answer.json()["fields"]["path"], name, outside)


def test_a_dataset_file_linked_outside_is_refused_at_launch(api, roots, outside):
    (outside / "chats.jsonl").write_text((roots / "chats.jsonl").read_text())
    (roots / "linked.jsonl").symlink_to(outside / "chats.jsonl")
    before = counts()
    answer = api("launcher").post("/api/v1/runs/", body(roots, dataset=str(roots / "linked.jsonl")))
    assert answer.status_code == 400 and "outside the allowed data roots" in answer.json()["fields"]["dataset"]
    assert counts() == before


def test_symlinks_staying_inside_the_roots_are_followed(api, roots):
    shared = roots / "shared"
    shared.mkdir()
    (shared / "config.json").write_text(json.dumps(CONFIG))
    (roots / "target" / "config.json").unlink()
    (roots / "target" / "config.json").symlink_to(shared / "config.json")
    (roots / "target" / "weights").symlink_to(shared, target_is_directory=True)  # a folder link inside, walked
    (roots / "target" / "loop").symlink_to(roots / "target", target_is_directory=True)  # walked once
    inspected = api("viewer").get("/api/v1/targets/inspect/", {"path": str(roots / "target")})
    assert inspected.status_code == 200 and inspected.json()["num_layers"] == 8
    assert api("launcher").post("/api/v1/runs/", body(roots, draft_vocab_size=64)).status_code == 201


def test_a_link_out_inside_a_linked_folder_inside_the_roots_is_refused(api, roots, outside):
    """The folder a link inside leads to is checked as the named folder is."""
    shared = roots / "shared"
    shared.mkdir()
    (outside / "leak").write_text("weights")
    (shared / "model.safetensors").symlink_to(outside / "leak")
    (roots / "target" / "weights").symlink_to(shared, target_is_directory=True)
    answer = api("viewer").get("/api/v1/targets/inspect/", {"path": str(roots / "target")})
    assert answer.status_code == 400
    _says_which_file(answer.json()["fields"]["path"], "weights/model.safetensors", outside)


def test_a_target_file_linked_outside_after_the_launch_fails_the_stage_naming_it(api, roots, outside):
    """The worker confines the folder again as a stage starts (a link swapped in after the launch): the stage fails
    naming the file, before a loader opens it. Run in this process, as a worker runs it."""
    from runs.models import PipelineRun, StageStatus
    from workers.orchestration.tasks import stage_execute

    run = PipelineRun.objects.get(pk=api("launcher").post("/api/v1/runs/", body(roots, draft_vocab_size=64)).json()["id"])
    linked_out(roots, outside, "tokenizer.json")
    assert stage_execute(stage_name="prepare", record_id=run.preparation.pk, worker="test") is False
    run.preparation.refresh_from_db()
    assert run.preparation.status == StageStatus.FAILED
    _says_which_file(run.preparation.error, "tokenizer.json", outside)
