"""POST /api/v1/checkpoints/<id>/export/ and the client's `checkpoints export`: a new folder under the data
roots with the checkpoint's served files and its card; a folder outside the roots is refused naming
`out_dir`, and nothing is written. (The card's figures against the database, and real vLLM serving the
folder: tests/e2e/vllm/test_export_checkpoint.py.)"""
from __future__ import annotations

import json

import pytest

from runs.models import Checkpoint, Evaluation, StageStatus
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.checkpoints.model_card import card_facts_read

pytestmark = pytest.mark.django_db


@pytest.fixture
def checkpoint(people, config_only_target, tmp_path):
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}) + "\n")
    run = services.run_launch(user=people["launcher"][0], target_path=config_only_target, dataset_path=chats,
                              config=RunConfig(draft_vocab_size=64))
    folder = tmp_path / "ckpt-1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3",
                                                    "eagle_aux_hidden_state_layer_ids": [2, 4, 5]}))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "optimizer_state_dict.pt").write_bytes(b"optimizer")
    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=1, path=str(folder), speculative_tokens=3)
    Evaluation.objects.create(checkpoint=checkpoint, status=StageStatus.SUCCEEDED, tau=2.4375, num_prompts=8,
                              num_speculative_tokens=3, acceptance_per_position=[0.75, 0.5, 0.1875],
                              prompt_source="held-out conversations")
    return checkpoint


def test_export_through_the_api_writes_the_folder_and_answers_its_card(checkpoint, api, data_root):
    out = data_root / "api-export" / "draft"
    answer = api("launcher").post(f"/api/v1/checkpoints/{checkpoint.pk}/export/", {"out_dir": str(out)})
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["path"] == str(out) and body["files"] == ["README.md", "config.json", "model.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == body["files"]
    card = card_facts_read((out / "README.md").read_text())
    assert card == body["card"]
    assert [(r["tau"], r["k"], r["num_prompts"], r["acceptance_per_position"]) for r in card["tau"]] == [
        (2.4375, 3, 8, [0.75, 0.5, 0.1875])]
    assert card["draft"]["aux_layer_ids"] == [2, 4, 5] and card["speedup"] == []
    assert f'"model": "{out}"' in body["serve_command"]
    # The same folder again: refused naming the field, the first export untouched.
    again = api("launcher").post(f"/api/v1/checkpoints/{checkpoint.pk}/export/", {"out_dir": str(out)})
    assert again.status_code == 400 and "already exists" in again.json()["fields"]["out_dir"]
    assert api("viewer").post(f"/api/v1/checkpoints/{checkpoint.pk}/export/", {}).status_code == 403


def test_export_outside_the_roots_is_refused_naming_out_dir_and_writes_nothing(checkpoint, api, tmp_path_factory):
    outside = "/var/tmp/eagle3web-api-export"
    refused = api("launcher").post(f"/api/v1/checkpoints/{checkpoint.pk}/export/", {"out_dir": outside})
    assert refused.status_code == 400 and "outside the allowed data roots" in refused.json()["fields"]["out_dir"]
    from pathlib import Path
    assert not Path(outside).exists()
    sneaky = api("launcher").post(f"/api/v1/checkpoints/{checkpoint.pk}/export/",
                                  {"out_dir": f"{tmp_path_factory.getbasetemp()}/../../etc/eagle3web"})
    assert sneaky.status_code == 400 and "out_dir" in sneaky.json()["fields"]


def test_export_without_a_folder_goes_under_the_runs_folder(checkpoint, api, settings):
    answer = api("admin").post(f"/api/v1/checkpoints/{checkpoint.pk}/export/", {})
    assert answer.status_code == 201, answer.json()
    from pathlib import Path
    path = Path(answer.json()["path"])
    assert path.parent == settings.EAGLE3WEB_RUNS_DIR / "exports" and path.name.startswith(f"checkpoint-{checkpoint.pk}-epoch-2-")
    assert (path / "README.md").is_file() and not (path / "optimizer_state_dict.pt").exists()
