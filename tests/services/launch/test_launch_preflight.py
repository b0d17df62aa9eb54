"""What a launch checks before anything is stored and before a GPU is spent (runs.pipeline.launch.preflight):
layer ids, the draft vocabulary against the target and its tokenizer, and, where vLLM is installed, that
vLLM's own config classes take the target and the draft's config.json as training writes it.

The tests marked slow ask the real vLLM (`make vllm`: .venv-vllm, or EAGLE3WEB_VLLM) and skip without it;
EAGLE3WEB_REQUIRE_VLLM=1 makes a missing vLLM fail them. Each asks in a child process that imports vLLM:
10 to 20 s on two busy cores."""
from __future__ import annotations

import io
import json
import time

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from runs.models import PipelineRun, TargetModel
from runs.pipeline.launch import preflight
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.errors import InputError
from workers.contract.target import TargetConfigError, validate_layer_ids
from workers.contract.host.vllm_env import VllmInstall
from tests.helpers.vllm_here import vllm_or_skip

pytestmark = pytest.mark.django_db

REFUSED_TP = {"vllm": "0.32.0", "ok": False, "part": "draft", "seconds": 9.0, "error": (
    "SpeculativeConfig: Value error, Total number of attention heads (32) must be divisible by tensor parallel "
    "size (3).")}


def launch(roots, user, **config):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(**config))


def refused(roots, user, **config) -> InputError:
    """The launch's refusal (RunConfigError, or the target's own error with the field run_launch blames)."""
    with pytest.raises(InputError) as caught:
        launch(roots, user, **config)
    assert PipelineRun.objects.count() == 0 and TargetModel.objects.count() == 0  # nothing stored
    return caught.value


@pytest.fixture(autouse=True)
def fresh_answers():
    preflight.cache_clear()
    yield
    preflight.cache_clear()


@pytest.fixture
def no_vllm(monkeypatch, tmp_path, settings):
    """This host without vLLM: EAGLE3WEB_VLLM names nothing, and a child process would fail the test."""
    settings.EAGLE3WEB_VLLM_PREFLIGHT_SECONDS = 60
    monkeypatch.setenv("EAGLE3WEB_VLLM", str(tmp_path / "no-vllm"))

    def no_child(*args, **kwargs):
        raise AssertionError(f"a child process was started without vLLM: {args}")

    monkeypatch.setattr(preflight.subprocess, "Popen", no_child)


@pytest.fixture
def fake_vllm(monkeypatch, settings):
    """A vLLM whose answer the test sets (`.answer`); `.asked` counts the questions."""
    settings.EAGLE3WEB_VLLM_PREFLIGHT_SECONDS = 60

    class Fake:
        answer = {"vllm": "0.32.0", "ok": True, "seconds": 9.0}
        asked = 0

    def ask(install, **kwargs):
        Fake.asked += 1
        return dict(Fake.answer)

    monkeypatch.setattr(preflight, "vllm_install", lambda: VllmInstall("/fake/vllm", "0.32.0+cpu", "cpu"))
    monkeypatch.setattr(preflight, "_ask_vllm", ask)
    return Fake


@pytest.fixture(scope="module")
def real_vllm():
    return vllm_or_skip()


@pytest.fixture
def vllm_on(real_vllm, settings):
    settings.EAGLE3WEB_VLLM_PREFLIGHT_SECONDS = 120  # two busy cores import vLLM in 10-20 s; a cold cache more
    return real_vllm


# --- layer ids and the draft vocabulary: no vLLM needed ------------------------------------------------------

def test_validate_layer_ids_takes_ids_0_to_n_and_refuses_repeats_and_ids_past_the_target():
    assert validate_layer_ids([0, 4, 8], 8) == [0, 4, 8]
    for ids, words in (([2, 9], "outside this target"), ([-1, 8], "outside this target"),
                       ([2, 2, 8], "without repeats"), ([5, 2, 8], "strictly increasing"), ([8], "at least one")):
        with pytest.raises(TargetConfigError, match=words):
            validate_layer_ids(ids, 8)


@pytest.mark.parametrize("ids, words", [([2, 2, 5], "without repeats"), ([2, 4, 9], "layer ids [9] are outside"),
                                        ([5, 2], "strictly increasing")])
def test_a_launch_with_repeated_or_outside_layer_ids_is_refused_naming_layer_ids(roots, user, no_vllm, ids, words):
    error = refused(roots, user, layer_ids=ids)
    assert error.field == "layer_ids", str(error)
    assert words in str(error)


def test_a_draft_vocabulary_larger_than_the_targets_is_refused_and_the_whole_one_is_not(roots, user, no_vllm):
    error = refused(roots, user, draft_vocab_size=5001)
    assert error.field == "draft_vocab_size" and "larger than the target's vocabulary (5000)" in str(error)
    assert launch(roots, user, draft_vocab_size=5000).vocab_mapping.draft_vocab_size == 5000


@pytest.mark.parametrize("tokenizer, top", [
    ({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 5000, "content": "<|end|>"}]},
     "'<|end|>' has id 5000"),
    ({"model": {"type": "WordLevel", "vocab": {"a": 0, "zz": 5003}}, "added_tokens": []}, "'zz' has id 5003"),
    ({"model": {"type": "Unigram", "vocab": [["x", 0.0]] * 5001}}, "'x' has id 5000"),
])
def test_a_tokenizer_with_ids_past_the_vocabulary_is_refused_naming_the_target(roots, user, no_vllm, tokenizer, top):
    """The vocab stage would refuse its token_freq.pt after prepare and extraction ran (d2t/t2d index the
    target's vocabulary), and the target could not embed those ids."""
    (roots / "target" / "tokenizer.json").write_text(json.dumps(tokenizer))
    error = refused(roots, user)
    assert error.field == "target_path" and top in str(error) and "vocabulary of 5000" in str(error)


def test_a_tokenizer_inside_the_vocabulary_or_unreadable_is_no_reason_to_refuse(roots, user, no_vllm):
    path = roots / "target" / "tokenizer.json"
    path.write_text(json.dumps({"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 4999, "content": "<s>"}]}))
    launch(roots, user)
    path.write_text("{not json")  # prepare loads the tokenizer and says what is wrong with it
    launch(roots, user)
    assert PipelineRun.objects.count() == 2


# --- without vLLM, or with it turned off: the launch goes on and says so -------------------------------------

def test_without_vllm_the_launch_goes_on_at_once_and_says_the_check_was_skipped(roots, user, no_vllm):
    started = time.monotonic()
    run = launch(roots, user)
    assert time.monotonic() - started < 5  # no child process (no_vllm fails one), nothing imported of vLLM
    assert run.config["vllm_check"].startswith("skipped: vllm is not installed")
    assert {k: v for k, v in run.config.items() if k != "vllm_check"} == {**RunConfig().as_dict(),
                                                                             "layer_ids": [2, 4, 5, 8]}


def test_the_skip_shows_in_the_api_answer_and_in_run_pipelines_summary(roots, user, no_vllm):
    from runs.api import tokens

    secret = tokens.token_create(user=user, name="preflight")[1]
    response = Client().post("/api/v1/runs/", json.dumps({"target": str(roots / "target"),
                                                          "dataset": str(roots / "chats.jsonl")}),
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 201, response.content
    assert response.json()["config"]["vllm_check"].startswith("skipped: vllm is not installed")
    out = io.StringIO()
    call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                 "--json", stdout=out)
    assert json.loads(out.getvalue())["config"]["vllm_check"].startswith("skipped: vllm is not installed")


def test_turned_off_the_check_is_skipped_saying_so(roots, user, fake_vllm, settings):
    settings.EAGLE3WEB_VLLM_PREFLIGHT_SECONDS = 0
    assert launch(roots, user).config["vllm_check"] == "skipped: turned off (EAGLE3WEB_VLLM_PREFLIGHT_SECONDS=0)"
    assert fake_vllm.asked == 0


# --- vLLM's answers, mapped to a field: a stand-in answers, as the real one does below ------------------------

@pytest.mark.parametrize("answer, field", [
    (REFUSED_TP, "tensor_parallel_size"),
    ({"ok": False, "part": "target", "error": "ModelConfig: Value error, Model architectures ['X'] are not "
                                              "supported for now."}, "target_path"),
    ({"ok": False, "part": "draft", "error": "SpeculativeConfig: num_speculative_tokens: Input should be greater "
                                             "than 0"}, "ttt_steps"),
    ({"ok": False, "part": "engine", "error": "something else about the draft"}, "target_path"),
])
def test_each_refusal_of_vllms_names_a_field(answer, field):
    assert preflight.blamed_field(answer) == field


def test_a_refusal_is_a_400_naming_the_field_in_the_api_a_form_error_on_it_and_a_failed_command(
        roots, user, fake_vllm):
    from runs.api import tokens

    fake_vllm.answer = REFUSED_TP
    error = refused(roots, user)
    assert error.field == "tensor_parallel_size" and str(error).startswith("vLLM 0.32.0 refuses the draft this run")
    assert "must be divisible by tensor parallel size (3)" in str(error)
    secret = tokens.token_create(user=user, name="preflight")[1]
    response = Client().post("/api/v1/runs/", json.dumps({"target": str(roots / "target"),
                                                          "dataset": str(roots / "chats.jsonl")}),
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 400 and list(response.json()["fields"]) == ["tensor_parallel_size"]
    assert response.json()["error"] == str(error)
    browser = Client()
    browser.force_login(user)
    page = browser.post("/runs/new/", {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"),
                                       **{k: v for k, v in RunConfig().as_dict().items()
                                          if k != "layer_ids" and v is not None and v is not False}})
    assert page.status_code == 400 and page.context["form"].errors["tensor_parallel_size"] == [str(error)]
    with pytest.raises(CommandError, match="^vLLM 0.32.0 refuses the draft this run would train"):
        call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"))
    assert PipelineRun.objects.count() == 0


def test_an_answer_is_kept_for_the_same_target_and_draft_and_asked_again_for_another(roots, user, fake_vllm):
    first = launch(roots, user)
    assert first.config["vllm_check"].startswith("accepted by vLLM 0.32.0 (method eagle3, 3 speculative tokens")
    launch(roots, user, epochs=5, lr=0.001)  # a sweep's settings that leave the draft's config as it was
    assert fake_vllm.asked == 1
    launch(roots, user, ttt_steps=4)
    assert fake_vllm.asked == 2


def test_no_answer_in_time_lets_the_launch_go_on_saying_it_went_unchecked(roots, user, fake_vllm):
    fake_vllm.answer = {"ok": None, "why": "vLLM's check took longer than 60 s"}
    run = launch(roots, user)
    assert run.config["vllm_check"] == ("not run: vLLM's check took longer than 60 s; the launch went on unchecked")
    launch(roots, user)
    assert fake_vllm.asked == 2  # not kept: the next launch asks again


# --- the real vLLM ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_real_vllm_accepts_a_good_launch(roots, user, vllm_on):
    started = time.monotonic()
    run = launch(roots, user)
    seconds = time.monotonic() - started
    assert run.config["vllm_check"].startswith("accepted by vLLM "), run.config["vllm_check"]
    print(f"the check added {seconds:.1f} s")


@pytest.mark.slow
def test_real_vllm_refuses_a_target_architecture_it_cannot_serve_naming_the_target(roots, user, vllm_on):
    config = json.loads((roots / "target" / "config.json").read_text())
    (roots / "target" / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    error = refused(roots, user)
    assert error.field == "target_path", str(error)
    assert "Model architectures ['NoSuchModelForCausalLM'] are not supported" in str(error)
    assert "Supported architectures" not in str(error)  # not the hundreds it knows


@pytest.mark.slow
def test_real_vllm_refuses_a_draft_whose_heads_the_tensor_parallel_size_does_not_divide(
        roots, user, vllm_on, monkeypatch):
    """A fleet with a 3-GPU vLLM worker (stood in for): the draft has the target's 4 attention heads."""
    monkeypatch.setattr(services, "launch_refusals", lambda **kwargs: [])
    config = json.loads((roots / "target" / "config.json").read_text())
    (roots / "target" / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4,
                                                              "num_key_value_heads": 4}))
    error = refused(roots, user, extraction_backend="vllm", tensor_parallel_size=3)
    assert error.field == "tensor_parallel_size", str(error)
    assert "divisible by tensor parallel size (3)" in str(error) and "the draft this run would train" in str(error)


@pytest.mark.slow
def test_real_vllm_past_its_time_lets_the_launch_go_on_and_leaves_no_process(roots, user, vllm_on, settings):
    import psutil

    settings.EAGLE3WEB_VLLM_PREFLIGHT_SECONDS = 2
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    run = launch(roots, user)
    assert time.monotonic() - started < 10
    assert run.config["vllm_check"] == "not run: vLLM's check took longer than 2 s; the launch went on unchecked"
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.slow
def test_the_draft_config_is_the_one_a_trained_checkpoint_holds(tmp_path):
    """workers/stages/train/draft/config.py against build_draft_model and the trainer's own save."""
    import numpy as np
    import torch
    from speculators.train.checkpointer import SingleGPUCheckpointer
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.stages.train.draft.config import draft_config_write
    from workers.stages.train.draft.model import build_draft_model

    target = tmp_path / "target"
    LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(target)
    np.save(tmp_path / "d2t.npy", np.zeros(48, dtype=np.int64))
    t2d = np.zeros(300, dtype=bool)
    t2d[:48] = True
    np.save(tmp_path / "t2d.npy", t2d)
    model = build_draft_model(target_dir=target, layer_ids=[1, 4, 6, 8], d2t_path=tmp_path / "d2t.npy",
                              t2d_path=tmp_path / "t2d.npy", draft_vocab_size=48, ttt_steps=4)
    SingleGPUCheckpointer(tmp_path / "trained").save_checkpoint(model, [torch.optim.AdamW(model.parameters())], 0)
    written = draft_config_write(target_dir=target, aux_layer_ids=[1, 4, 6], draft_vocab_size=48, ttt_steps=4,
                                 out_dir=tmp_path / "preflight")
    assert json.loads(written.read_text()) == json.loads((tmp_path / "trained" / "0" / "config.json").read_text())
