"""The sweep page: its runs with the swept settings as columns, status and tau, the best marked with
the button that launches it again with more data; the sweeps list in the navigation."""
import pytest

from runs.models import Evaluation, StageStatus, SweepRun
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stages import STAGES
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary

pytestmark = pytest.mark.django_db


@pytest.fixture
def sweep(user, roots):
    return sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                        config=RunConfig(draft_vocab_size=64, max_samples=30), name="vocab sweep",
                        varied=[parse_vary("draft_vocab_size=32,64"), parse_vary("lr=1e-4,3e-4")])


def test_the_page_lists_each_run_with_its_swept_settings_status_and_tau(client, user, sweep):
    ids = list(SweepRun.objects.filter(sweep=sweep).order_by("position").values_list("run_id", flat=True))
    for stage in STAGES:
        stage.model.objects.filter(run_id=ids[2]).update(status=StageStatus.SUCCEEDED)
    Evaluation.objects.filter(run_id=ids[2]).update(tau=2.345)
    client.force_login(user)
    html = client.get(f"/sweeps/{sweep.pk}/").content.decode()
    # Each run's lowest validation loss so far and its training's tokens/s sit between its status and τ.
    assert ("<th><code>draft_vocab_size</code></th><th><code>lr</code></th><th>Status</th>"
            '<th title="the lowest validation loss of its checkpoints so far">Val loss</th>'
            '<th title="its training\'s tokens per second">Tokens/s</th><th>τ</th>') in html
    row = html.split(f'<tr data-run="{ids[2]}" class="best">')[1].split("</tr>")[0]
    assert '<td data-key="draft_vocab_size"><code>64</code></td><td data-key="lr"><code>1e-4</code></td>' in row
    assert '<span class="badge" data-field="best">best τ</span>' in row and '<td data-field="tau">2.345</td>' in row
    held = html.split(f'<tr data-run="{ids[3]}">')[1].split("</tr>")[0]
    assert ">held</span>" in held
    assert f'href="/runs/new/?copy={ids[2]}&amp;more_data=1"' in html
    assert "1 of 4 runs measured" in html
    assert '<a href="/sweeps/">Sweeps</a>' in html
    assert f'<a href="/runs/compare/?ids={",".join(map(str, ids))}" id="sweep-compare">Compare its runs</a>' in html


def test_a_sweep_larger_than_compare_links_its_ten_highest_tau_runs(client, user, roots):
    big = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                       config=RunConfig(draft_vocab_size=64, max_samples=30), varied=[parse_vary("seed=" + ",".join(
                           str(s) for s in range(12)))])
    ids = list(SweepRun.objects.filter(sweep=big).order_by("position").values_list("run_id", flat=True))
    for stage in STAGES:  # the last run measured: it is among the ten, the two unmeasured before it are not
        stage.model.objects.filter(run_id=ids[11]).update(status=StageStatus.SUCCEEDED)
    Evaluation.objects.filter(run_id=ids[11]).update(tau=2.1)
    client.force_login(user)
    html = client.get(f"/sweeps/{big.pk}/").content.decode()
    shown = [*ids[:9], ids[11]]
    assert f'<a href="/runs/compare/?ids={",".join(map(str, shown))}" id="sweep-compare">Compare the 10 with the highest τ</a>' in html
    assert client.get(f"/runs/compare/?ids={','.join(map(str, shown))}").status_code == 200



def test_launch_the_best_again_prefills_a_copy_with_twice_the_conversations(client, user, sweep):
    run_id = SweepRun.objects.filter(sweep=sweep, position=2).values_list("run_id", flat=True).get()
    client.force_login(user)
    html = client.get(f"/runs/new/?copy={run_id}&more_data=1").content.decode()
    assert 'name="max_samples" value="60"' in html
    assert "max_samples 30 → 60" in html and "the best of sweep vocab sweep" in html
    assert 'name="draft_vocab_size" value="32"' in html and 'name="lr" value="0.0003"' in html


def test_a_sweep_from_the_form_refused_on_a_value_stores_nothing_and_says_so_at_the_box(client, user, roots):
    from runs.models import Dataset, PipelineRun, Sweep, TargetModel

    client.force_login(user)
    form = {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "max_seq_len": 512,
            "draft_vocab_size": 64, "epochs": 1, "lr": 0.0003, "ttt_steps": 3, "sweep_mode": "grid", "parallel": 1}
    response = client.post("/runs/new/", {**form, "vary": "epochs = 1, 2\nlayer_ids = 2:4, 2:9"})
    assert response.status_code == 400
    html = response.content.decode()
    box = html.split('data-field="vary"')[1].split("</div>\n</div>")[0]
    message = "layer_ids = 2:9: layer ids [9] are outside this target"  # the box's words, not --vary's
    assert message in box and message in html.split('id="launch-errors"')[1].split("</div>")[0]
    assert '<details class="fold" id="sweep" open>' in html
    assert not any(m.objects.exists() for m in (Sweep, PipelineRun, TargetModel, Dataset))
    response = client.post("/runs/new/", {**form, "vary": "epochs = 1, 2"})
    sweep = Sweep.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/sweeps/{sweep.pk}/"
    assert sorted(PipelineRun.objects.values_list("config__epochs", flat=True)) == [1, 2]
