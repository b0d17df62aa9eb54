"""Comparing runs: the settings that differ, each curve's summary side by side, refusals named."""
import pytest

from runs.tracking.services import metrics_record
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.services import run_launch

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(user, data_root, tmp_path, django_capture_on_commit_callbacks):
    import json

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 4096}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                                              {"from": "gpt", "value": "hé ✓"}]}) + "\n")
    out = []
    with django_capture_on_commit_callbacks(execute=False):
        for i, lr in enumerate((1e-3, 3e-4, 1e-3)):
            out.append(run_launch(user=user, target_path=target, dataset_path=chats, config=RunConfig(lr=lr),
                                  name=f"lr run {i}", enqueue=False))
    for i, run in enumerate(out[:2]):
        metrics_record(training_run_id=run.training_run.pk, points=[
            {"split": "train", "key": "loss_0", "step": s, "epoch": s / 10, "value": 5.0 - s * (i + 1) / 10}
            for s in range(10)])
    return out


def test_compare_shows_what_differs_and_the_curves_side_by_side(client, user, runs):
    client.force_login(user)
    response = client.get("/runs/compare/", {"ids": f"{runs[0].pk},{runs[1].pk}"})
    assert response.status_code == 200
    ctx = response.context
    assert [row["name"] for row in ctx["differ"]] == ["lr"]
    assert ctx["differ"][0]["values"] == [1e-3, 3e-4]
    loss = next(m for m in ctx["metrics"] if m["key"] == "loss_0")
    assert [s["last"] for s in loss["runs"]] == [pytest.approx(4.1), pytest.approx(3.2)]
    assert [s["min_step"] for s in loss["runs"]] == [9, 9]
    page = response.content.decode()
    assert 'id="compare-differ"' in page and "lr run 1" in page and "compare-chart-runs" in page


def test_checkboxes_style_ids_and_a_run_without_curves(client, user, runs):
    client.force_login(user)
    response = client.get(f"/runs/compare/?ids={runs[0].pk}&ids={runs[2].pk}")
    assert response.status_code == 200
    assert response.context["differ"] == []  # same settings: nothing differs but the name
    loss = next(m for m in response.context["metrics"] if m["key"] == "loss_0")
    assert loss["runs"][1] is None


@pytest.mark.parametrize("query, message", [
    ("ids=1", "pick 2 to 50 runs"), ("ids=" + ",".join(str(i) for i in range(1, 52)), "pick 2 to 50 runs"),
    ("ids=1,abc", "not a run id"), ("ids=999998,999999", "no run 999998, 999999"), ("", "pick 2 to 50 runs"),
])
def test_bad_selections_are_refused_by_name(client, user, runs, query, message):
    client.force_login(user)
    response = client.get("/runs/compare/?" + query)
    assert response.status_code == 400 and message in response.content.decode()
