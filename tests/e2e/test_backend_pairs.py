"""A run launched with the GPU backends (vLLM extraction, speculators' trainer) goes through the
same stage glue as the default pair: routing, the worker's backend check, dispatch, and the
records each stage leaves (extraction and manifest, curves, checkpoints, acceptance).

Boundaries we cannot reach here, named in the test: the GPU (the worker's device probe is told this
host has one, FAKE_GPU), vLLM (tests/standins/vllm on PATH, which writes what vLLM's hidden-states
connector writes, computed with the real target) and speculators' device-0 move (its CPU seam,
tests/stages/train/with_speculators/speculators_cpu_seam). Everything else is real: prepare, the vocabulary,
speculators' own trainer under torchrun, our evaluation of its checkpoint, PostgreSQL."""
import json
import os
import sys
from pathlib import Path

import pytest

from runs.pipeline import services
from runs.models import Checkpoint, MetricSeries, StageStatus
from runs.pipeline.dispatch.routing import stage_backend
from runs.pipeline.launch.run_config import RunConfig
from tests.helpers.fleet import fake_gpu_worker
from workers.contract.host import backends, vllm_env
from workers.orchestration.tasks import pipeline_run_inline

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
TESTS = Path(__file__).resolve().parents[1]
FAKE_GPU = backends.Gpu(name="FAKE test GPU (a stand-in: this machine has none)", memory_bytes=80 * 2**30)


@pytest.fixture
def fake_gpu_host(monkeypatch, settings):
    monkeypatch.setattr(backends, "detect_gpus", lambda: (FAKE_GPU,))
    # The stand-in runs on this venv's Python (its `#!/usr/bin/env python3` finds it first).
    monkeypatch.setenv("PATH", os.pathsep.join([str(TESTS / "standins"), str(Path(sys.executable).parent),
                                                os.environ["PATH"]]))
    # The worker's probe reads vLLM's version with the executable's Python; the stand-in has none, so
    # the probe is told what a GPU host's vLLM would say (FAKE, as the GPU).
    standin = str(TESTS / "standins" / "vllm")
    monkeypatch.setattr(vllm_env, "vllm_install",
                        lambda: vllm_env.VllmInstall(executable=standin, version="0.33.0", build="cuda"))
    # speculators' CPU seam, and its GPU kernels swapped for eager ones (flags a CPU host would set).
    monkeypatch.setenv("EAGLE3WEB_TEST_CPU_AS_DEVICE", "1")
    monkeypatch.setenv("PYTHONPATH", str(TESTS / "stages" / "train" / "with_speculators" / "speculators_cpu_seam"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    settings.EAGLE3WEB_SPECULATORS_ARGS = ["--draft-attn-impl", "eager", "--loss-implementation", "eager",
                                           "--num-workers", "0"]
    fake_gpu_worker()  # FAKE: a live worker advertising vLLM and speculators, so that the launch accepts them


def test_vllm_standin_extraction_and_speculators_training_fake_gpu_run_every_stage(tiny_target, user, fake_gpu_host):
    config = RunConfig(max_samples=30, max_seq_len=256, draft_vocab_size=128, epochs=2, ttt_steps=2,
                       eval_prompts=4, eval_max_new_tokens=16, extraction_backend="vllm", training_backend="speculators")
    run = services.run_launch(user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                              config=config, enqueue=False)
    assert stage_backend(stage_name="extract", config=run.config) == ("vllm", 1)
    assert stage_backend(stage_name="train", config=run.config) == ("speculators", 1)

    pipeline_run_inline(run_id=run.pk)

    run.refresh_from_db()
    stages = [run.preparation, run.extract_stage, run.vocab_mapping, run.training_run, run.evaluation]
    for stage in stages:
        stage.refresh_from_db()
    assert [s.status for s in stages] == [StageStatus.SUCCEEDED] * 5, [(s.status, s.error[-2000:]) for s in stages]
    extraction = run.extract_stage.extraction
    manifest = json.loads((Path(extraction.path) / "data_config.json").read_text())
    assert manifest["extraction_backend"] == "vllm" and manifest["total_tokens"] == extraction.total_tokens
    assert extraction.latest_verification.passed
    assert (Path(extraction.path) / "vllm_server.log").is_file()  # the stand-in was started as vLLM would be
    keys = set(MetricSeries.objects.filter(training_run=run.training_run).values_list("split", "key"))
    assert {("train", "loss_0"), ("train", "loss_1"), ("val", "full_acc_0")} <= keys
    checkpoints = list(Checkpoint.objects.filter(training_run=run.training_run).order_by("epoch"))
    assert [c.epoch for c in checkpoints] == [0, 1] and sum(c.is_best for c in checkpoints) == 1
    config_json = json.loads((Path(checkpoints[0].path) / "config.json").read_text())
    assert config_json["speculators_model_type"] == "eagle3"  # speculators' own checkpoint
    assert run.evaluation.tau is not None and run.evaluation.output_matches_greedy is True
