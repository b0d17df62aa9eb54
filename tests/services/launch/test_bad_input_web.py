"""Bad-input corpus: the launch form, the run config, the JSON API's parameters and reviews.
Each is answered with a message naming the field (a 4xx on the API), never a 500; nothing is stored."""
import json

import pytest

from runs.models import Dataset, PipelineRun, Review, TargetModel
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import MAX_LAYER_IDS, RunConfigError
from runs.pipeline.launch.setting_checks import parse_layer_ids
from runs.pipeline.services import run_launch

pytestmark = pytest.mark.django_db


@pytest.fixture
def paths(data_root, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 5000}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    return {"target_path": str(target), "dataset_path": str(chats)}


def form(paths, **over):
    data = {**paths, "name": "", "layer_ids": "", "max_seq_len": 512, "draft_vocab_size": 1024, "epochs": 2,
            "lr": 3e-4, "ttt_steps": 3}
    data.update(over)
    return data


@pytest.mark.parametrize(
    "over, problem",
    [
        ({"name": "n" * 201}, "at most 200 characters"),
        ({"name": "a\x07b"}, "name may not hold control characters"),
        ({"layer_ids": "2, 5000"}, "layer_ids must lie between 0 and 1024"),
        ({"layer_ids": "2, " + "9" * 40}, "layer ids must be integers"),
        ({"max_seq_len": 10**7}, "less than or equal to 131072"),
        ({"max_samples": 10**12}, "less than or equal to 2147483647"),
        ({"draft_vocab_size": 10**9}, "less than or equal to 1000000"),
        ({"target_path": "/data/a\tb"}, "a path may not hold control characters"),
        ({"dataset_path": "/" + "d" * 1200}, "at most 1000 characters"),
    ],
    ids=["name-201", "name-bell", "layer-id-5000", "layer-id-40-digits", "seq-len-1e7", "samples-1e12",
         "draft-vocab-1e9", "path-tab", "path-1200"],
)
def test_launch_form_refuses_with_a_message_and_stores_nothing(client, user, paths, over, problem):
    client.force_login(user)
    response = client.post("/runs/new/", form(paths, **over))
    assert response.status_code == 400
    assert problem in response.content.decode()
    assert (PipelineRun.objects.count(), TargetModel.objects.count(), Dataset.objects.count()) == (0, 0, 0)


def test_launch_form_refuses_a_billion_layer_target_with_a_message(client, user, paths, tmp_path):
    (tmp_path / "target" / "config.json").write_text(json.dumps({"num_hidden_layers": 10**9, "hidden_size": 64,
                                                                 "vocab_size": 5000}))
    client.force_login(user)
    response = client.post("/runs/new/", form(paths))
    assert response.status_code == 400
    assert "num_hidden_layers must be a positive integer no larger than 1024" in response.content.decode()
    assert (PipelineRun.objects.count(), TargetModel.objects.count()) == (0, 0)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_seq_len": True}, "max_seq_len"),
        ({"max_seq_len": 10**7}, "max_seq_len"),
        ({"epochs": 2.5}, "epochs"),
        ({"lr": float("nan")}, "lr"),
        ({"val_fraction": "0.1"}, "val_fraction"),
        ({"layer_ids": list(range(MAX_LAYER_IDS + 1))}, "layer_ids"),
        ({"layer_ids": [2, "4"]}, "layer_ids"),
        ({"max_samples": 2**40}, "max_samples"),
    ],
    ids=["seq-len-bool", "seq-len-1e7", "epochs-float", "lr-nan", "val-fraction-str", "1026-layer-ids",
         "layer-id-str", "samples-2**40"],
)
def test_run_config_bounds_every_field(kwargs, field):
    with pytest.raises(RunConfigError, match=f"^{field} "):
        RunConfig(**kwargs)


def test_run_launch_service_refuses_a_bad_config_before_storing(user, paths):
    with pytest.raises(RunConfigError, match="layer_ids"):
        run_launch(user=user, config=RunConfig(layer_ids=[2, 5000]), enqueue=False, **paths)
    assert PipelineRun.objects.count() == 0


def test_parse_layer_ids_bounds_text_and_count():
    with pytest.raises(RunConfigError, match="at most 1025"):
        parse_layer_ids(",".join(["1"] * 2000))
    with pytest.raises(RunConfigError, match="too long"):
        parse_layer_ids("1," * 6000)


@pytest.fixture
def run(user, paths, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        return run_launch(user=user, config=RunConfig(), enqueue=False, **paths)


@pytest.mark.parametrize(
    "params, problem",
    [({"start": "abc"}, "start must be an integer"), ({"start": "9" * 30}, "start must be an integer"),
     ({"end": "-1"}, "end must be an integer"), ({"points": "1.5"}, "points must be an integer"),
     ({"start": "9" * 5000}, "start must be an integer"), ({"after": "3"}, "unknown parameter 'after'")],
    ids=["letters", "30-digits", "negative", "float", "5000-digits", "unknown"],
)
def test_api_metrics_parameters_are_validated_with_400(client, user, run, params, problem):
    client.force_login(user)
    response = client.get(f"/api/v1/runs/{run.pk}/metrics/", params)
    assert response.status_code == 400 and problem in response.json()["error"]


@pytest.mark.parametrize("url", ["/api/v1/runs/99999999999999999999/status/", "/api/v1/runs/99999999999999999999/metrics/"])
def test_api_run_id_beyond_64_bits_is_404_not_500(client, user, url):
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 404


@pytest.mark.parametrize(
    "text, problem",
    [("r" * 10_001, "10001 characters long; at most 10000 are allowed"), ("bad\x00byte", "Text holds a NUL character")],
    ids=["10001-chars", "nul"],
)
def test_review_text_is_bounded(client, user, run, text, problem):
    client.force_login(user)
    response = client.post(f"/reviews/run/{run.pk}/", {"decision": "comment", "text": text}, follow=True)
    assert response.status_code < 500
    assert problem in response.content.decode()
    assert Review.objects.count() == 0
