"""The web tier never imports torch, transformers or speculators.

A fresh interpreter (this one has torch loaded already) sets Django up on a throwaway SQLite
database, imports the URL map, then renders every page and submits every form the pages offer
(launch, extraction import from the browser, "Verify now", reviews, cancel, retry, evaluate), runs
the verifications those queued the way a worker does, and reports which heavy modules ended up in
sys.modules.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "transformers", "speculators", "datasets")

SCRIPT = r"""
import json, os, sys, time
from pathlib import Path

import django

django.setup()
# The CPU seconds of this process (what importing costs it): the wall clock counts the other processes of two busy
# cores too (2.0 s against 1.5 with the suite in two workers).
started = time.process_time()
import eagle3web.urls  # noqa: E402,F401
urls_seconds = time.process_time() - started

from django.contrib import admin  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402

from runs.models import Checkpoint, Dataset, Extraction, PipelineRun, Verification  # noqa: E402
from tests.helpers.artifacts import extraction_written  # noqa: E402

call_command("migrate", verbosity=0)
paths = json.loads(os.environ["WEB_TEST_PATHS"])
user = get_user_model().objects.create_superuser("root", password="pw-root-1")
client = Client(SERVER_NAME="localhost")
client.force_login(user)
status = {}


def visit(label, url, data=None):
    response = client.post(url, data or {}) if data is not None else client.get(url)
    status[label] = response.status_code
    return response


launched = visit("launch POST", "/runs/new/", {
    "target_path": paths["target"], "dataset_path": paths["chats"], "layer_ids": "", "max_seq_len": 64,
    "draft_vocab_size": 32, "epochs": 1, "lr": 0.0003, "ttt_steps": 3})
run = PipelineRun.objects.first()
assert run is not None, launched.content.decode()[-3000:]
# The run's own extraction, of files with their prepared rows: "Verify now" compares token ids.
extraction = extraction_written(run, path=paths["flat_run"], layout="flat_v1")
preparation = run.preparation
preparation.out_dir = paths["prepared"]
preparation.save(update_fields=["out_dir"])
for name in ("flat", "v04", "s09", "miscounted"):
    visit(f"import {name} POST", "/extractions/import/", {"path": paths[name], "target_path": paths["target"]})
imported = list(Extraction.objects.filter(produced_by=None).order_by("pk"))
miscounted = imported.pop()
checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=paths["checkpoint"],
                                       val_metrics={"cond_acc_0": 0.5, "cond_acc_1": 0.4}, is_best=True)
for e in [extraction, *imported]:
    visit(f"verify {e.pk} POST", f"/extractions/{e.pk}/verify/", {})
    if e.layout != "speculators_v04":  # values of .pt files are read with torch
        visit(f"verify full {e.pk} POST", f"/extractions/{e.pk}/verify/", {"full": "on"})
visit("override POST", f"/extractions/{miscounted.pk}/override/", {"reason": "the manifest is wrong"})
for subject, pk in (("run", run.pk), ("extraction", imported[0].pk), ("checkpoint", checkpoint.pk)):
    visit(f"review {subject} POST", f"/reviews/{subject}/{pk}/", {"decision": "comment", "text": "looks right"})
visit("evaluate POST", f"/checkpoints/{checkpoint.pk}/evaluate/", {"prompts_path": paths["chats"]})
visit("cancel POST", f"/runs/{run.pk}/cancel/", {})
visit("retry POST", f"/runs/{run.pk}/retry/", {})

pages = ["/", "/runs/new/", f"/runs/{run.pk}/", "/datasets/", f"/datasets/{Dataset.objects.get().pk}/",
         "/extractions/", "/extractions/import/", f"/extractions/{extraction.pk}/",
         *[f"/extractions/{e.pk}/" for e in [*imported, miscounted]], f"/checkpoints/{checkpoint.pk}/",
         f"/api/v1/runs/{run.pk}/status/", f"/api/v1/runs/{run.pk}/metrics/", f"/api/v1/targets/inspect/?path={paths['target']}",
         "/workers/", "/api/v1/workers/", "/admin/"]
pages += [reverse(f"admin:{m._meta.app_label}_{m._meta.model_name}_changelist") for m in admin.site._registry]
for url in pages:
    visit(url, url)
# Verifications run on a worker; it runs them here the way it would (and needs no torch either).
from runs.pipeline.jobs.models import VerificationRequest  # noqa: E402
from workers.orchestration.tasks import stage_execute  # noqa: E402

for job in VerificationRequest.objects.filter(status="queued").order_by("pk"):
    assert stage_execute(stage_name="verify", record_id=job.pk, worker="test"), job.pk
for e in [extraction, *imported, miscounted]:
    visit(f"/extractions/{e.pk}/ verified", f"/extractions/{e.pk}/")
print(json.dumps({"status": status, "urls_seconds": urls_seconds,
                  "verified": sorted({v.passed for e in [extraction, *imported] for v in e.verifications.all()}),
                  "miscounted": [c["name"] for c in miscounted.latest_verification.failures],
                  "full": sorted(v.extraction.layout for v in Verification.objects.filter(full=True)),
                  "modules": {m: m in sys.modules for m in %(heavy)r}}))
"""


@pytest.fixture
def files(tmp_path):
    """A config-only target, a chat file, extractions in the three layouts, prepared rows, a checkpoint."""
    from datasets import Dataset

    from tests.contract.test_verify import LENGTHS, _sample, write_09, write_flat, write_v04

    data = tmp_path / "data"
    target = data / "target"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "num_hidden_layers": 8, "hidden_size": 16, "vocab_size": 100}))
    chats = data / "chats.jsonl"
    chats.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}]}) + "\n"
        for i in range(3)))
    prepared = data / "prepared"
    rows = Dataset.from_dict({"input_ids": [_sample(i, t)[0].tolist() for i, t in enumerate(LENGTHS)]})
    rows.set_format("torch")  # as the prepare stage saves it
    rows.save_to_disk(str(prepared))
    checkpoint = data / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    return {"target": str(target), "chats": str(chats), "prepared": str(prepared), "checkpoint": str(checkpoint),
            "flat": str(write_flat(data / "flat")), "flat_run": str(write_flat(data / "flat-run")),
            "v04": str(write_v04(data / "v04")), "s09": str(write_09(data / "s09")),
            "miscounted": str(write_flat(data / "miscounted", total_samples=5)), "data": str(data)}


def test_pages_and_their_forms_never_import_torch(tmp_path, files):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3WEB_", "DJANGO_", "CELERY_"))}
    env.update(DJANGO_SETTINGS_MODULE="eagle3web.settings", PYTHONPATH=str(ROOT),
               DATABASE_URL=f"sqlite:///{tmp_path / 'web.sqlite3'}", CELERY_BROKER_URL="filesystem://",
               EAGLE3WEB_DATA_DIR=str(tmp_path / "state"), EAGLE3WEB_DATA_ROOTS=files["data"],
               WEB_TEST_PATHS=json.dumps(files))
    proc = subprocess.run([sys.executable, "-c", SCRIPT % {"heavy": HEAVY}], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"import eagle3web.urls after django.setup(): {result['urls_seconds']:.3f} s of CPU")
    posts = {k: v for k, v in result["status"].items() if k.endswith("POST")}
    gets = {k: v for k, v in result["status"].items() if not k.endswith("POST")}
    assert set(posts.values()) == {302}, posts  # each form redirects to the page it changed
    assert set(gets.values()) == {200}, gets
    assert result["verified"] == [True]  # the three layouts, and the run's rows token by token, all pass
    assert result["full"] == ["flat_v1", "flat_v1", "speculators_09"]  # values scanned without torch too
    assert "sample_count" in result["miscounted"]
    assert not any(result["modules"].values()), result["modules"]
    assert result["urls_seconds"] < 1.5


def test_extraction_floor_counts_the_stored_dtype():
    from runs.models import Extraction

    assert Extraction(layer_ids=[2, 4, 5, 8], hidden_size=16, dtype="bfloat16").floor_bytes_per_token == 4 * 16 * 2
    assert Extraction(layer_ids=[2, 4, 5, 8], hidden_size=16, dtype="").floor_bytes_per_token == 4 * 16 * 2
    assert Extraction(layer_ids=[2, 4, 5, 8], hidden_size=16,
                      dtype="float8_e4m3fn").floor_bytes_per_token == 4 * 16 + 4
    assert Extraction(layer_ids=[], hidden_size=16, dtype="bfloat16").floor_bytes_per_token is None
