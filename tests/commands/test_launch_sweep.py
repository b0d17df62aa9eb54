"""`manage.py launch_sweep --json`: run_pipeline's options plus --vary, every run validated as a single
launch is; a bad value names the swept key and value and stores nothing (no runs, no target, no dataset).

Non-transactional tests: nothing is handed to the broker (on-commit never fires); the outbox rows say
which runs the sweep handed over."""
import io
import json

import pytest
from django.core.management import CommandError, call_command

from runs.models import Dataset, PendingEnqueue, PipelineRun, Sweep, SweepRun, TargetModel

pytestmark = pytest.mark.django_db


def launch_sweep(roots, *args):
    out = io.StringIO()
    call_command("launch_sweep", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                 "--draft-vocab-size", "64", "--max-samples", "10", *args, "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def refused(roots, *args) -> dict:
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("launch_sweep", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                     "--draft-vocab-size", "64", *args, "--json", stdout=out)
    answer = json.loads(out.getvalue().strip().splitlines()[-1])
    assert answer["error"] == str(caught.value)
    return answer


def nothing_stored() -> bool:
    return not any(m.objects.exists() for m in (Sweep, SweepRun, PipelineRun, TargetModel, Dataset, PendingEnqueue))


def test_a_grid_of_two_by_two_launches_four_runs_with_their_settings(roots):
    summary = launch_sweep(roots, "--vary", "lr=1e-4,3e-4", "--vary", "epochs=1,2", "--name", "lr-epochs")
    assert len(summary["run_ids"]) == 4
    sweep = Sweep.objects.get(pk=summary["sweep_id"])
    assert (sweep.name, sweep.mode, sweep.parallel) == ("lr-epochs", "grid", 1)
    assert sweep.varied == [["lr", ["1e-4", "3e-4"]], ["epochs", ["1", "2"]]]
    runs = [PipelineRun.objects.get(pk=pk) for pk in summary["run_ids"]]
    assert [(r.config["lr"], r.config["epochs"]) for r in runs] == [(1e-4, 1), (1e-4, 2), (3e-4, 1), (3e-4, 2)]
    # What every run shares is run_pipeline's options, defaults included.
    assert {(r.config["draft_vocab_size"], r.config["max_samples"], r.config["ttt_steps"]) for r in runs} == {(64, 10, 3)}
    assert {tuple(r.config["layer_ids"]) for r in runs} == {(2, 4, 5, 8)}
    assert [r.training_run.epochs for r in runs] == [1, 2, 1, 2]
    assert [r.name for r in runs] == ["lr-epochs: lr=1e-4 epochs=1", "lr-epochs: lr=1e-4 epochs=2",
                                      "lr-epochs: lr=3e-4 epochs=1", "lr-epochs: lr=3e-4 epochs=2"]
    assert [r["settings"] for r in summary["runs"]] == [{"lr": "1e-4", "epochs": "1"}, {"lr": "1e-4", "epochs": "2"},
                                                        {"lr": "3e-4", "epochs": "1"}, {"lr": "3e-4", "epochs": "2"}]
    # Queued fairly: one run of the sweep in the queue, three held until it finishes.
    assert list(PendingEnqueue.objects.filter(kind="pipeline").values_list("object_id", flat=True)) == [summary["run_ids"][0]]
    assert [r["status"] for r in summary["runs"]] == ["queued", "held", "held", "held"]


def test_a_list_pairs_values_and_layer_ids_take_colons(roots):
    summary = launch_sweep(roots, "--list", "--vary", "layer-ids=2:4,1:3:6", "--vary", "ttt_steps=1,2",
                           "--parallel", "2")
    runs = [PipelineRun.objects.get(pk=pk) for pk in summary["run_ids"]]
    assert [(r.config["layer_ids"], r.config["ttt_steps"]) for r in runs] == [([2, 4, 8], 1), ([1, 3, 6, 8], 2)]
    assert summary["mode"] == "list" and summary["parallel"] == 2
    assert sorted(PendingEnqueue.objects.filter(kind="pipeline").values_list("object_id", flat=True)) == sorted(summary["run_ids"])


def test_a_data_sweep_varies_the_dataset_and_the_sample_count(roots):
    (roots / "more-chats.jsonl").write_text((roots / "chats.jsonl").read_text() * 3)
    summary = launch_sweep(roots, "--vary", f"dataset={roots / 'chats.jsonl'},{roots / 'more-chats.jsonl'}",
                           "--vary", "max_samples=default,2")
    runs = [PipelineRun.objects.select_related("dataset").get(pk=pk) for pk in summary["run_ids"]]
    assert [(r.dataset.name, r.config["max_samples"]) for r in runs] == [
        ("chats.jsonl", None), ("chats.jsonl", 2), ("more-chats.jsonl", None), ("more-chats.jsonl", 2)]


def test_a_value_runconfig_refuses_names_key_and_value_and_stores_nothing(roots):
    answer = refused(roots, "--vary", "lr=1e-4,2", "--vary", "epochs=1,2")
    assert answer == {"error": "--vary lr=2: lr must be between 0 and 1, got 2.0", "field": "vary"}
    assert nothing_stored()


def test_a_value_the_target_refuses_rolls_back_the_runs_before_it(roots):
    # The first run (layers 2:4) is valid and was stored before the second was refused: all or none.
    answer = refused(roots, "--vary", "layer_ids=2:4,2:9")
    assert answer["error"] == ("--vary layer_ids=2:9: layer ids [9] are outside this target: valid ids are 0..8 "
                               "(0 = embeddings, 8 = last hidden state)")
    assert nothing_stored()


def test_a_missing_dataset_is_named_with_its_value(roots):
    missing = roots / "nope.jsonl"
    answer = refused(roots, "--vary", f"dataset={roots / 'chats.jsonl'},{missing}")
    assert answer["error"].startswith(f"--vary dataset={missing}: dataset file {missing}")
    assert nothing_stored()


@pytest.mark.parametrize("vary, error", [
    ("lr=1e-4,abc", "--vary lr=abc: lr takes numbers, such as 3e-4"),
    ("layer_ids=2;4,1:3", "--vary layer_ids=2;4: layer ids are whole numbers separated by ':' within one value"),
    ("colour=red,blue", "--vary 'colour': not an option a sweep can vary"),
    ("epochs=1,1", "--vary epochs: 1 and 1 are the same value"),
    ("epochs", "--vary 'epochs': write KEY=V1,V2"),
])
def test_a_malformed_vary_is_refused_naming_it(roots, vary, error):
    answer = refused(roots, "--vary", vary)
    assert answer["error"].startswith(error) and answer["field"] == "vary"
    assert nothing_stored()


def test_a_list_with_unequal_lengths_and_an_oversized_grid_are_refused(roots):
    assert refused(roots, "--list", "--vary", "lr=1e-4,3e-4", "--vary", "epochs=1,2,3")["error"] == (
        "--list pairs the i-th values of every key, so each key needs as many values: lr has 2, epochs has 3")
    big = refused(roots, "--vary", "seed=" + ",".join(map(str, range(9))), "--vary", "epochs=" + ",".join(map(str, range(1, 9))))
    assert big["error"].startswith("this sweep would launch 72 runs; at most 64")
    assert nothing_stored()
