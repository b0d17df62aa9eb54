"""Bad-input corpus: target config.json files. Each is refused before anything is stored,
with an InputError whose message names the field (or the file), through the launch service."""
import json

import pytest

from runs.pipeline import services
from runs.models import Dataset, PipelineRun, TargetModel
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.errors import InputError
from workers.contract.inputs.jsonfile import MAX_JSON_BYTES, MAX_JSON_DEPTH
from workers.contract.target import (
    MAX_HIDDEN_SIZE,
    MAX_NUM_LAYERS,
    MAX_VOCAB_SIZE,
    TargetConfigError,
    read_target_config,
)

pytestmark = pytest.mark.django_db

GOOD = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
        "hidden_size": 64, "vocab_size": 5000}


def counts():
    return (TargetModel.objects.count(), PipelineRun.objects.count(), Dataset.objects.count())


@pytest.fixture
def chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    return path


def launch_with_config(tmp_path, user, chats, text: str | bytes):
    target = tmp_path / "target"
    target.mkdir()
    blob = text if isinstance(text, bytes) else text.encode()
    (target / "config.json").write_bytes(blob)
    before = counts()
    with pytest.raises(InputError) as err:
        services.run_launch(user=user, target_path=target, dataset_path=chats, config=RunConfig(), enqueue=False)
    assert counts() == before, "nothing may be stored for a refused config"
    return str(err.value)


def with_(**over):
    cfg = dict(GOOD)
    cfg.update(over)
    return json.dumps(cfg)


@pytest.mark.parametrize(
    "config, field",
    [
        (with_(num_hidden_layers=10**9), "num_hidden_layers"),
        (with_(num_hidden_layers=MAX_NUM_LAYERS + 1), "num_hidden_layers"),
        ('{"num_hidden_layers": 3e9, "hidden_size": 64, "vocab_size": 5000}', "num_hidden_layers"),
        (with_(num_hidden_layers=True), "num_hidden_layers"),
        (with_(num_hidden_layers=0), "num_hidden_layers"),
        (with_(num_hidden_layers=8.0), "num_hidden_layers"),
        (with_(hidden_size=MAX_HIDDEN_SIZE + 1), "hidden_size"),
        (with_(vocab_size=MAX_VOCAB_SIZE + 1), "vocab_size"),
        (with_(vocab_size=-5), "vocab_size"),
        (with_(text_config={"num_hidden_layers": 2000, "hidden_size": 64, "vocab_size": 5000}),
         "text_config.num_hidden_layers"),
        (with_(text_config=[1, 2]), "text_config"),
        (with_(architectures="LlamaForCausalLM"), "architectures"),
        (with_(architectures=[1]), "architectures[0]"),
        (with_(architectures=["A" * 300]), "architectures[0]"),
        (with_(model_type="m" * 500), "model_type"),
        (with_(model_type=["llama"]), "model_type"),
    ],
    ids=["layers-1e9", "layers-1025", "layers-3e9-float", "layers-bool", "layers-0", "layers-8.0",
         "hidden-too-wide", "vocab-too-big", "vocab-negative", "nested-layers", "text-config-list",
         "architectures-string", "architectures-int", "architecture-300-chars", "model-type-500-chars",
         "model-type-list"],
)
def test_target_config_values_are_bounded_and_typed(tmp_path, user, chats, config, field):
    message = launch_with_config(tmp_path, user, chats, config)
    assert f"{field} must" in message and "config.json" in message


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[" * 100_000 + "]" * 100_000, f"nested deeper than {MAX_JSON_DEPTH} levels"),
        (with_(extra=json.loads("[" * 100 + "]" * 100)), f"nested deeper than {MAX_JSON_DEPTH} levels"),
        (b'{"num_hidden_layers": 8, "name": "\xff\xfe"}', "not UTF-8"),
        (with_(rope_scaling=None)[:-1] + ', "x": NaN}', "NaN is not a JSON number"),
        (with_(name="a\u0000b"), "NUL character"),
        ('{"num_hidden_layers": ' + "9" * 5000 + "}", "not usable JSON"),
        ("{" + " " * (MAX_JSON_BYTES + 10) + "}", "larger than 8 MiB"),
    ],
    ids=["depth-100000", "depth-100", "not-utf8", "nan", "nul-string", "5000-digit-int", "over-8MiB"],
)
def test_config_json_size_depth_and_encoding_are_bounded(tmp_path, user, chats, text, problem):
    message = launch_with_config(tmp_path, user, chats, text)
    assert problem in message and "config.json" in message


def test_a_config_at_the_bounds_is_accepted(tmp_path):
    (tmp_path / "config.json").write_text(with_(num_hidden_layers=MAX_NUM_LAYERS, hidden_size=MAX_HIDDEN_SIZE,
                                                 vocab_size=MAX_VOCAB_SIZE))
    cfg = read_target_config(tmp_path)
    assert (cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == (MAX_NUM_LAYERS, MAX_HIDDEN_SIZE, MAX_VOCAB_SIZE)


def test_api_inspect_refuses_a_billion_layers_with_400(client, user, tmp_path):
    target = tmp_path / "huge"
    target.mkdir()
    (target / "config.json").write_text(with_(num_hidden_layers=10**9))
    client.force_login(user)
    response = client.get("/api/v1/targets/inspect/", {"path": str(target)})
    assert response.status_code == 400
    assert "num_hidden_layers must be a positive integer no larger than 1024" in response.json()["error"]
    assert TargetModel.objects.count() == 0


def test_api_inspect_refuses_a_deeply_nested_config_with_400(client, user, tmp_path):
    target = tmp_path / "deep"
    target.mkdir()
    (target / "config.json").write_text("[" * 50_000 + "]" * 50_000)
    client.force_login(user)
    response = client.get("/api/v1/targets/inspect/", {"path": str(target)})
    assert response.status_code == 400 and "nested deeper" in response.json()["error"]


def test_target_config_error_is_an_input_error():
    assert issubclass(TargetConfigError, InputError)
