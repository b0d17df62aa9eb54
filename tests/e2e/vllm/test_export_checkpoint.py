"""`manage.py export_checkpoint`: a folder vLLM serves as it is, with a model card whose figures are the
database's (issue 39).

One real run of the demo-sized target (`run_pipeline --inline`, seconds) gives a checkpoint with its
measurement, its extraction's layer ids and its dataset; its first conversation is excluded by curation
before the run, so the card's lineage has an exclusion to state. The served speed-up row is a serve
check's stored figures (a succeeded row written here: the real serve check is tests/e2e/vllm/test_real_vllm.py's,
two vLLM starts). The last test starts real vLLM (its CPU build) once, on the exported folder alone."""
from __future__ import annotations

import io
import json
import shlex
import urllib.request
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.helpers.vllm_here import vllm_or_skip

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _json(name: str, *args) -> dict:
    out = io.StringIO()
    call_command(name, *args, "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run(tiny_target, django_db_setup, django_db_blocker, tmp_path_factory):
    from django.contrib.auth import get_user_model
    from django.test import override_settings

    from runs.data.curation import dataset_samples_sync, samples_set_excluded
    from runs.models import Dataset, DatasetSample, PipelineRun, StageAttempt, TargetModel
    from runs.pipeline.services import dataset_register

    root = tmp_path_factory.getbasetemp().resolve()
    with django_db_blocker.unblock(), override_settings(EAGLE3WEB_DATA_ROOTS=[root], EAGLE3WEB_RUNS_DIR=root / "export-runs"):
        chats = tmp_path_factory.mktemp("export-data") / "chats.jsonl"
        chats.write_bytes(tiny_target.chats_path.read_bytes())
        dataset = dataset_register(path=chats)
        dataset_samples_sync(dataset=dataset)
        first = DatasetSample.objects.filter(dataset=dataset).order_by("line")[:1]
        samples_set_excluded(samples=DatasetSample.objects.filter(pk__in=list(first.values_list("pk", flat=True))),
                             excluded=True, user=get_user_model().objects.create_user("curator"))
        summary = _json("run_pipeline", "--target", str(tiny_target.target_dir), "--dataset", str(chats),
                        "--layer-ids", "2,4,5", "--max-samples", "40", "--max-seq-len", "256", "--draft-vocab-size",
                        "256", "--epochs", "2", "--eval-prompts", "6", "--eval-max-new-tokens", "16", "--inline")
        yield summary
        StageAttempt.objects.all().delete()
        PipelineRun.objects.all().delete()
        TargetModel.objects.all().delete()
        Dataset.objects.all().delete()
        get_user_model().objects.all().delete()


def _served_row(checkpoint_id: int):
    from runs.models import Checkpoint, StageStatus
    from runs.pipeline.jobs.models import ServeCheck

    checkpoint = Checkpoint.objects.get(pk=checkpoint_id)
    evaluation = checkpoint.evaluations.get()
    return ServeCheck.objects.create(checkpoint=checkpoint, evaluation=evaluation, status=StageStatus.SUCCEEDED,
                                     num_speculative_tokens=3, vllm_version="0.32.0", vllm_build="cpu",
                                     vllm_tokens_per_s_with=41.5, vllm_tokens_per_s_without=30.25, vllm_speedup=1.372,
                                     concurrency=[1, 8], concurrency_results=[
                                         {"concurrency": 1, "requests": 6, "device": "cpu", "tokens_per_s_with": 41.5,
                                          "tokens_per_s_without": 30.25, "tpot_ms_with": 22.75,
                                          "tpot_ms_without": 31.5, "speedup": 1.372},
                                         {"concurrency": 8, "requests": 8, "device": "cpu", "tokens_per_s_with": 120.0,
                                          "tokens_per_s_without": 150.0, "tpot_ms_with": 60.25,
                                          "tpot_ms_without": 48.0, "speedup": 0.8}])


def test_export_writes_the_served_files_and_a_card_whose_figures_are_the_databases(run, tmp_path):
    from runs.models import Checkpoint, DatasetSample
    from workers.contract.checkpoints.model_card import card_facts_read

    assert [s["status"] for s in run["stages"]] == ["succeeded"] * 5, run["stages"]
    best = next(c for c in run["checkpoints"] if c["is_best"])
    check = _served_row(best["id"])
    out = tmp_path / "deploy" / "draft"
    answer = _json("export_checkpoint", str(best["id"]), str(out))
    assert Path(answer["path"]) == out.resolve()
    # What vLLM reads, and the card; not the optimizer state nor the trainer's bookkeeping.
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == (Path(best["path"]) / "model.safetensors").read_bytes()
    card_text = (out / "README.md").read_text()
    card = card_facts_read(card_text)

    checkpoint = Checkpoint.objects.get(pk=best["id"])
    evaluation = checkpoint.evaluations.get()
    assert [(r["evaluation_id"], r["tau"], r["num_prompts"], r["acceptance_per_position"]) for r in card["tau"]] == [
        (evaluation.pk, evaluation.tau, evaluation.num_prompts, evaluation.acceptance_per_position)]
    assert evaluation.num_prompts > 0 and 1.0 <= evaluation.tau
    assert f"{evaluation.tau:,.3f}" in card_text
    # The speed-up at each concurrency measured: the table is the serve check's stored rows, level for level.
    columns = ("concurrency", "tokens_per_s_with", "tokens_per_s_without", "tpot_ms_with", "tpot_ms_without", "speedup")
    check.refresh_from_db()
    assert [tuple(r[c] for c in columns) for r in card["speedup"]] == [
        tuple(r[c] for c in columns) for r in check.concurrency_results]
    assert [r["cpu"] for r in card["speedup"]] == [True, True] and {r["serve_check_id"] for r in card["speedup"]} == {check.pk}
    assert "| 1 | 3 | 41.5 | 30.2 | 22.8 | 31.5 | 1.37× |" in card_text, card_text
    assert "| 8 | 3 | 120.0 | 150.0 | 60.2 | 48.0 | 0.80× |" in card_text
    assert "CPU figures" in card_text
    # Target and layer ids: the run's extraction (HF hidden_states indices, the last layer appended) and the
    # draft's own config.
    assert card["draft"]["extracted_layer_ids"] == run["extraction"]["layer_ids"] == [2, 4, 5, 8]
    config = json.loads((out / "config.json").read_text())
    assert card["draft"]["aux_layer_ids"] == config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert card["target"]["path"] == run["target"]["config_path"].removesuffix("/config.json")
    # Lineage: the dataset, not regenerated, and the curation that excluded its first conversation.
    lineage = card["lineage"]
    assert lineage["dataset"]["path"] == run["dataset"]["path"] and lineage["regenerated_from"] is None
    assert lineage["curation"]["excluded_at_preparation"] == 1
    assert lineage["curation"]["excluded_now"] == DatasetSample.objects.filter(excluded=True).count() == 1
    assert [(a["action"], a["count"], a["user"]) for a in lineage["curation"]["actions"]] == [("exclude", 1, "curator")]
    assert lineage["preparation"]["rows"] == run["tokens"]["rows"]
    # τ by k and the recommended k: the measurement's k table (runs.checkpoints.k_selectors).
    from runs.checkpoints.k_selectors import tau_by_k

    assert card["tau_by_k"] == {str(k): tau for k, tau in tau_by_k(evaluation).items()}
    assert card["recommended_k"] == evaluation.recommended_k
    # The serve line names the exported folder, at the recommended k (else the draft's own).
    spec = json.loads(shlex.split(card["serve_command"])[-1])
    assert spec == {"model": str(out.resolve()), "method": "eagle3",
                    "num_speculative_tokens": evaluation.recommended_k or checkpoint.speculative_tokens}
    assert card["serve_command"] in card_text and answer["serve_command"] == card["serve_command"]


def test_export_refuses_a_folder_outside_the_roots_or_one_that_exists_and_writes_nothing(run, tmp_path):
    best = next(c for c in run["checkpoints"] if c["is_best"])
    with pytest.raises(CommandError, match="outside the allowed data roots"):
        call_command("export_checkpoint", str(best["id"]), "/var/tmp/eagle3web-export-refused")
    assert not Path("/var/tmp/eagle3web-export-refused").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(CommandError, match="already exists"):
        call_command("export_checkpoint", str(best["id"]), str(taken))
    assert [p.name for p in taken.iterdir()] == ["keep.txt"] and (taken / "keep.txt").read_text() == "mine"
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no half-written folder left


def test_the_exported_folder_is_served_by_real_vllm_with_its_draft(run, tiny_target, tmp_path):
    """vLLM (CPU build) loads the exported folder as the draft, by the card's own serve line, and drafts with it."""
    from workers.contract.host.vllm_env import kvcache_gib, server_environment
    from workers.stages.evaluate.serve_check import parse_spec_counters
    from workers.stages.extract.vllm_server import HOST, VllmServer, free_port
    from workers.contract.target import read_target_json, target_dtype

    install = vllm_or_skip()
    best = next(c for c in run["checkpoints"] if c["is_best"])
    out = tmp_path / "served"
    answer = _json("export_checkpoint", str(best["id"]), str(out))
    line = shlex.split(answer["serve_command"])
    assert line[:2] == ["vllm", "serve"] and json.loads(line[-1])["model"] == str(out.resolve())
    port = free_port()
    command = [install.executable, *line[1:], "--dtype", target_dtype(tiny_target.target_dir), "--max-model-len", "128",
               "--host", HOST, "--port", str(port)]
    env = server_environment(install, kvcache_space_gib=kvcache_gib(
        target_config=read_target_json(tiny_target.target_dir), max_model_len=128, concurrency=1))
    with VllmServer(command=command, log_path=tmp_path / "vllm.log", port=port, env=env) as server:
        server.wait_healthy(timeout_s=900, should_stop=None, on_stop=lambda: RuntimeError("not stopped"))
        body = {"model": str(tiny_target.target_dir), "prompt": [0, 5, 6, 7, 8, 9, 10], "max_tokens": 16, "temperature": 0.0}
        request = urllib.request.Request(f"{server.base_url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            reply = json.loads(response.read())
        with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as response:
            counters = parse_spec_counters(response.read().decode(), k=json.loads(line[-1])["num_speculative_tokens"])
    assert reply["choices"][0]["text"] is not None
    assert counters.drafts > 0, "vLLM served the request without drafting: the exported draft was not loaded"
