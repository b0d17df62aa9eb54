"""An external run fed by Eagle3WebMetricsHandler from a real run of speculators' trainer: torchrun runs the
docs' example (docs/runs/speculators.md) (client/examples/speculators_train.py) against a live server, and the run's
curves read back through GET /api/v1/runs/<id>/metrics/ equal what the trainer logged, as the dashboard's own record
writer copied it beside (the known answer). Its checkpoints are registered. A batch sent again is not
doubled, a lost answer to a batch is asked again, and a refused batch is counted, never raised.

speculators 0.9 cannot run on a host without an accelerator: the test named `..._cpu_device_patched` runs
it with the test-only seam (tests/stages/train/with_speculators/speculators_cpu_seam/) that maps its device-0 calls to
the CPU."""
from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from eagle3web_client import ApiError, Client, Eagle3WebMetricsHandler, record_points
from runs.models import Checkpoint
from tests.stages.train.with_speculators.test_train_speculators import (CPU_ARGS, CPU_SEAM_ENV, DRAFT_VOCAB,
                                                                      pipeline_run_folder)
from workers.contract.extraction.speculators_layout import speculators_data_link
from workers.stages.train.results import METRIC_KEY  # the dashboard's own trainings' names
from workers.stages.train.with_speculators.trainer import ENTRY_MODULE, default_torchrun, speculators_command

REPO = Path(__file__).resolve().parents[2]
ENTRY = Path(__file__).resolve().parent / "speculators_entry.py"
EPOCHS = 2


@pytest.fixture(scope="module")
def speculators_data(tiny_target, tmp_path_factory):
    """What a cluster holds before it trains: the target, hidden states and vocab in speculators' layout."""
    run = pipeline_run_folder(tiny_target, tmp_path_factory.mktemp("cluster"))
    data = speculators_data_link(prepared_dir=run["prepared_dir"], hidden_states_dir=run["hidden_states_dir"],
                                 d2t_path=run["d2t_path"], t2d_path=run["t2d_path"],
                                 out_dir=run["run"] / "speculators_data")
    return {"target_dir": run["target_dir"], "data_dir": data.data_dir, "layer_ids": run["layer_ids"]}


def _known_points(lines: list[dict]) -> tuple[dict[tuple[str, str, int], float], dict[tuple[str, str, int], float]]:
    """The trainer's records as the dashboard's own trainings name their points (docs/runs/speculators.md, Training with
    speculators' trainer): train at global_step + 1, val at the record's step without "_epoch". Returns
    the values and the epochs (a train step's 0-based epoch, epoch + 1 for validation)."""
    known, epochs = {}, {}
    for line in lines:
        record = line.get("record")
        if record is None:
            continue
        if "train" in record:
            step = record["global_step"] + 1
            values = {k: v for k, v in record["train"].items() if METRIC_KEY.match(k)}
            lr = record["lr"]  # speculators' default optimizer is muon: {"Muon": lr, "AdamW": lr}; --lr sets AdamW's
            values["lr"] = lr["AdamW"] if isinstance(lr, dict) else lr
            values["tokens_per_s"] = record["profile"]["tokens_per_s"]
            known.update({(k, "train", step): v for k, v in values.items()})
            epochs.update({(k, "train", step): float(record["epoch"]) for k in values})
        else:
            values = {k.removesuffix("_epoch"): v for k, v in record["val"].items() if METRIC_KEY.match(k.removesuffix("_epoch"))}
            known.update({(k, "val", line["step"]): v for k, v in values.items()})
            epochs.update({(k, "val", line["step"]): record["epoch"] + 1.0 for k in values})
    return known, epochs


def _stored_points(client: Client, run_id: int) -> dict[tuple[str, str, int], float]:
    answer = client.runs.metrics(run_id, points=20000)
    stored = {}
    for series in answer["series"]:
        assert len(series["steps"]) == len(set(series["steps"])), series["key"]  # no step twice
        stored.update({(series["key"], series["split"], step): value
                       for step, value in zip(series["steps"], series["values"])})
    return stored


def test_speculators_trainer_reports_its_curves_and_checkpoints_through_the_handler_cpu_device_patched(
        live_server, launcher_token, speculators_data, tmp_path):
    client = Client(live_server.url, launcher_token)
    run = client.runs.create_external(name="speculators on another cluster", target=str(speculators_data["target_dir"]),
                                      config={"epochs": EPOCHS, "lr": 3e-3, "ttt_steps": 3, "trainer": "speculators"})
    out_dir = tmp_path / "checkpoints"
    command = speculators_command(
        torchrun=default_torchrun(), num_gpus=1, fsdp=False, target_dir=speculators_data["target_dir"],
        data_dir=speculators_data["data_dir"], out_dir=out_dir, aux_layer_ids=speculators_data["layer_ids"][:-1],
        draft_vocab_size=DRAFT_VOCAB, epochs=EPOCHS, lr=3e-3, ttt_steps=3, seed=0, total_seq_len=256,
        train_data_ratio=0.8, extra_args=CPU_ARGS)
    at = command.index("-m")
    assert command[at + 1] == ENTRY_MODULE
    # the docs' example (docs/runs/speculators.md) script in place of the workers' entry module
    command[at:at + 2] = [str(ENTRY)]
    records = tmp_path / "records.jsonl"
    env = {**os.environ, **CPU_SEAM_ENV, "PYTHONPATH": os.pathsep.join([CPU_SEAM_ENV["PYTHONPATH"], str(REPO)]),
           "EAGLE3WEB_URL": live_server.url, "EAGLE3WEB_TOKEN": launcher_token, "EAGLE3WEB_RUN_ID": str(run["id"]),
           "EAGLE3WEB_METRICS_PATH": str(records), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    (tmp_path / "trainer.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "not stored" not in done.stdout + done.stderr and "not registered" not in done.stdout + done.stderr

    lines = [json.loads(line) for line in records.read_text().splitlines()]
    known, epochs = _known_points(lines)
    train_steps = sorted({step for _, split, step in known if split == "train"})
    assert train_steps == list(range(1, len(train_steps) + 1)) and len(train_steps) >= 4
    assert sorted({step for _, split, step in known if split == "val"}) == [
        json.loads((out_dir / str(e) / "training_state.json").read_text())["global_step"] for e in range(EPOCHS)]
    assert {"loss", "loss_0", "loss_2", "full_acc_0", "cond_acc_2", "lr", "tokens_per_s"} <= {k for k, _, _ in known}
    assert _stored_points(client, run["id"]) == known  # every logged value, at its step, unrounded, once

    checkpoints = Checkpoint.objects.filter(training_run__run_id=run["id"]).order_by("epoch")
    assert [(c.epoch, c.path) for c in checkpoints] == [(e, str((out_dir / str(e)).resolve())) for e in range(EPOCHS)]
    # Everything sent again (a client that retried after a lost answer) changes nothing.
    again = [{"key": k, "split": split, "step": step, "value": v, "epoch": epochs[(k, split, step)]}
             for (k, split, step), v in known.items()]
    assert client.runs.log_metrics(run["id"], again) == {"accepted": 0, "unchanged": len(known), "replaced": 0}
    assert _stored_points(client, run["id"]) == known
    assert client.runs.get(run["id"])["status"] == "running"  # until its client ends it
    assert client.runs.end(run["id"], status="succeeded", message="2 epochs on the CPU")["status"] == "succeeded"
    with pytest.raises(ApiError) as refused:
        client.runs.log_metrics(run["id"], again[:1])
    assert refused.value.status == 409


def test_a_batch_sent_twice_or_whose_answer_was_lost_is_stored_once(proxy, launcher_token, transactional_db):
    client = Client(proxy.url, launcher_token, backoff_seconds=0.05)
    run = client.runs.create_external(name="retries", config={})
    points = [{"key": "loss", "split": "train", "step": s, "value": 10.0 / s, "epoch": 0.0} for s in range(1, 301)]
    assert client.runs.log_metrics(run["id"], points) == {"accepted": 300, "unchanged": 0, "replaced": 0}
    assert client.runs.log_metrics(run["id"], points) == {"accepted": 0, "unchanged": 300, "replaced": 0}
    more = [{"key": "loss", "split": "train", "step": s, "value": 10.0 / s, "epoch": 0.0} for s in range(301, 401)]
    proxy.faults = [("POST", f"/api/v1/runs/{run['id']}/metrics/", "drop")]
    # The first POST stored the 100 points and its answer was lost; the retry finds them stored.
    assert client.runs.log_metrics(run["id"], more) == {"accepted": 0, "unchanged": 100, "replaced": 0}
    assert [s for _, p, s in proxy.seen if p.endswith("/metrics/")] == ["200", "200", "dropped 200", "200"]
    stored = _stored_points(client, run["id"])
    assert stored == {("loss", "train", s): 10.0 / s for s in range(1, 401)}


def _train_record(step: int, loss: float) -> dict:
    return {"train": {"loss": loss, "loss_0": loss, "full_acc_0": 0.5, "error_records": 0.0}, "profile": None,
            "epoch": 0, "lr": 1e-3, "global_step": step}


def test_the_handler_batches_flushes_on_close_and_counts_what_the_server_refused(live_server, launcher_token,
                                                                                 caplog):
    client = Client(live_server.url, launcher_token)
    run = client.runs.create_external(name="handler", config={})
    handler = Eagle3WebMetricsHandler(client, run["id"], batch_size=7, flush_seconds=60)
    logger = logging.getLogger("speculators.metrics")
    logger.setLevel(logging.INFO)
    handler.install(logger)
    try:
        logger.info({"learning_rate": 1e-3, "model": {"layers": 1}}, extra={"hparams": True})
        for step in range(10):
            logger.info(_train_record(step, 5.0 - step * 0.1), extra={"step": step})
        logger.info({"val": {"loss_epoch": 4.0, "full_acc_0_epoch": 0.6, "loss_0_epoch": float("nan")}, "epoch": 0},
                    extra={"step": 10})
        logger.info("not a dict")
        handler.close()
    finally:
        logger.removeHandler(handler)
    # 10 train records of 4 points (loss, loss_0, full_acc_0, lr) and a val record of 2 (its NaN left out).
    assert (handler.sent_points, handler.accepted, handler.failed_points) == (42, 42, 0)
    assert (handler.skipped_records, handler.skipped_values, handler.hparams) == (2, 1, {"learning_rate": 1e-3,
                                                                                          "model": {"layers": 1}})
    stored = _stored_points(client, run["id"])
    assert stored[("loss", "train", 10)] == pytest.approx(4.1) and stored[("loss", "val", 10)] == 4.0
    assert len(stored) == 42
    # Closed is not dead: speculators' dictConfig closes every existing handler, then logs through them.
    handler.install(logger)
    logger.info(_train_record(10, 3.0), extra={"step": 10})
    assert handler.flush(timeout=30) and handler.sent_points == 46
    logger.removeHandler(handler)

    client.runs.end(run["id"], status="failed", message="stopped by hand")
    late = Eagle3WebMetricsHandler(client, run["id"], batch_size=100, flush_seconds=0.1)
    record = logging.LogRecord("speculators.metrics", logging.INFO, __file__, 1, _train_record(20, 1.0), None, None)
    record.step = 20
    with caplog.at_level(logging.WARNING, logger="eagle3web_client"):
        late.handle(record)  # a refused batch: counted and reported, never raised into the trainer
        late.close()
    assert (late.sent_points, late.failed_points) == (0, 4)
    assert "has ended" in late.last_error and "4 metric points for run" in caplog.text
    assert len(_stored_points(client, run["id"])) == 46


def test_record_points_names_points_as_the_dashboard_does():
    points, skipped = record_points({"train": {"loss": 2.5, "loss_1": 2.0, "cond_acc_1": 0.25, "error_records": 3.0,
                                               "loss_sum": 9.0}, "profile": {"step_ms": 20.0, "tokens_per_s": 800.0},
                                     "epoch": 1, "lr": {"Muon": 0.02, "AdamW": 0.001}, "global_step": 41}, step=41)
    assert skipped == 0 and points == [
        {"key": "loss", "split": "train", "step": 42, "value": 2.5, "epoch": 1.0},
        {"key": "loss_1", "split": "train", "step": 42, "value": 2.0, "epoch": 1.0},
        {"key": "cond_acc_1", "split": "train", "step": 42, "value": 0.25, "epoch": 1.0},
        {"key": "lr", "split": "train", "step": 42, "value": 0.001, "epoch": 1.0},
        {"key": "tokens_per_s", "split": "train", "step": 42, "value": 800.0, "epoch": 1.0}]
    assert record_points({"val": {"loss_epoch": 1.5, "full_acc_2_epoch": 0.7}, "epoch": 1}, step=60) == (
        [{"key": "loss", "split": "val", "step": 60, "value": 1.5, "epoch": 2.0},
         {"key": "full_acc_2", "split": "val", "step": 60, "value": 0.7, "epoch": 2.0}], 0)
    assert record_points({"learning_rate": 0.1}, step=None) is None
