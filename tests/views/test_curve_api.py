"""The curve endpoint a run page polls: each curve's new steps and values as columns, only what is new."""
import json

import pytest

from runs import services
from runs.run_config import RunConfig
from runs.stage_services import metrics_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(tmp_path, settings, user):
    data = tmp_path / "data"
    (data / "target").mkdir(parents=True)
    settings.EAGLE3WEB_DATA_ROOTS = [data.resolve()]
    settings.EAGLE3WEB_RUNS_DIR = data.resolve() / "runs"
    (data / "target" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
        "hidden_size": 64, "vocab_size": 5000}))
    (data / "chats.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    return services.run_launch(user=user, target_path=data / "target", dataset_path=data / "chats.jsonl",
                               config=RunConfig(), enqueue=False)


def points(steps, split="train"):
    return [{"step": s, "epoch": s / 10, "split": split, "key": key, "value": s + offset}
            for s in steps for key, offset in (("loss", 0.5), ("lr", 0.25))]


def test_the_curves_come_as_columns_per_curve_and_a_poll_gets_only_the_new_steps(client, user, run):
    client.force_login(user)
    url = f"/api/runs/{run.pk}/metrics/"
    metrics_record(training_run_id=run.training_run.pk, points=points([1, 2]))
    first = client.get(url, {"after": 0}).json()
    assert first["series"] == {"train:loss": {"step": [1, 2], "value": [1.5, 2.5]},
                               "train:lr": {"step": [1, 2], "value": [1.25, 2.25]}}
    assert first["count"] == 4
    metrics_record(training_run_id=run.training_run.pk, points=points([3]) + points([3], split="val"))
    second = client.get(url, {"after": first["last_id"]}).json()
    assert second["series"] == {"train:loss": {"step": [3], "value": [3.5]}, "train:lr": {"step": [3], "value": [3.25]},
                                "val:loss": {"step": [3], "value": [3.5]}, "val:lr": {"step": [3], "value": [3.25]}}
    assert second["last_id"] > first["last_id"]
    idle = client.get(url, {"after": second["last_id"]}).json()
    assert idle == {"series": {}, "count": 0, "last_id": second["last_id"]}
