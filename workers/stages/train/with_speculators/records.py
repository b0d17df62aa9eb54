"""speculators' metric records (written by with_speculators/entry.py) turned into our points, epochs and
checkpoints while its trainer runs: the keys as workers.stages.train.loop reports them, train step =
its global_step + 1, an epoch's checkpoint registered once its validation was logged and its folder
is whole (see with_speculators/trainer.py for what speculators logs)."""
from __future__ import annotations

import collections
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path

from workers.stages.train.results import METRIC_KEY, CheckpointInfo
from workers.stages.train.online.source import SupplyReport
from workers.stages.train.with_speculators.ledger import EpochDone, checkpoint_whole, ledger_save

logger = logging.getLogger(__name__)


class MetricCapture:
    """Turns the entry module's metric lines into our points, epochs and checkpoints."""

    def __init__(self, *, path: Path, plan, out_dir: Path, ledger, on_metrics, on_checkpoint, on_progress,
                 online: bool = False):
        self.path, self.plan, self.out_dir, self.ledger, self.online = path, plan, out_dir, ledger, online
        self.on_metrics, self.on_checkpoint, self.on_progress = on_metrics, on_checkpoint, on_progress
        self.offset, self.points, self.device = 0, [], ""
        self.step = ledger.global_step
        self.losses: dict[int, list[float]] = collections.defaultdict(list)
        self.profiled: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        self.pending_val: dict[int, tuple[int, dict]] = {}
        self.dropped_samples = 0.0
        self.waited = [0.0, 0.0, 0]  # this attempt's logged steps: fetch seconds, step seconds, tokens

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self.offset += len(whole)
        for line in whole.decode("utf-8").splitlines():
            self._line(json.loads(line))
        self._register_checkpoints()
        self.flush()

    def _line(self, line: dict) -> None:
        if "device" in line:
            self.device = line["device"]
            return
        record = line["record"]
        if "train" in record:
            self._train(record)
        elif "val" in record:
            epoch, step = int(record["epoch"]), int(line["step"])
            values = {k.removesuffix("_epoch"): float(v) for k, v in record["val"].items()
                      if METRIC_KEY.match(k.removesuffix("_epoch"))}
            self.points += [{"step": step, "epoch": float(epoch + 1), "split": "val", "key": k, "value": v}
                            for k, v in values.items()]
            self.pending_val[epoch] = (step, values)

    def _train(self, record: dict) -> None:
        epoch, step = int(record["epoch"]), int(record["global_step"]) + 1
        local = step - self.plan.steps_before(epoch)
        values = {k: float(v) for k, v in record["train"].items() if METRIC_KEY.match(k)}
        self.dropped_samples += float(record["train"].get("error_records", 0.0))
        lr = record.get("lr")
        if isinstance(lr, Mapping):  # muon: {"Muon": lr, "AdamW": lr}; --lr sets AdamW's
            lr = lr.get("AdamW", next(iter(lr.values()), None))
        if isinstance(lr, (int, float)):
            values["lr"] = float(lr)
        if 1 <= local <= self.plan.steps_per_epoch[epoch]:
            tokens = self.plan.step_tokens[epoch][local - 1]
            values["tokens_seen"] = float(self.plan.tokens_through(epoch, local))
            profile = record.get("profile") or {}
            step_ms, fetch_ms = profile.get("step_ms"), profile.get("fetch_ms")
            if isinstance(step_ms, (int, float)) and step_ms > 0:
                values["tokens_per_s"] = tokens / (step_ms / 1000)
                self.profiled[epoch][0] += tokens
                self.profiled[epoch][1] += step_ms / 1000
                if isinstance(fetch_ms, (int, float)):  # its step timer's wait for the batch (rank 0)
                    self.waited = [self.waited[0] + fetch_ms / 1000, self.waited[1] + step_ms / 1000,
                                   self.waited[2] + tokens]
                    if self.online:  # charted as our own loop's online supply figure
                        values["supply/fetch_wait_fraction"] = min(1.0, self.waited[0] / self.waited[1])
        if "loss" in values:
            self.losses[epoch].append(values["loss"])
        fraction = epoch + local / max(self.plan.steps_per_epoch[epoch], 1)
        self.points += [{"step": step, "epoch": round(fraction, 6), "split": "train", "key": k, "value": v}
                        for k, v in values.items()]
        self.step = step
        if self.on_progress is not None:
            self.on_progress(step, self.plan.total_steps)

    def flush(self) -> None:
        if self.points and self.on_metrics is not None:
            self.on_metrics(self.points)
        self.points = []

    def _register_checkpoints(self) -> None:
        for epoch in sorted(self.pending_val):
            folder = self.out_dir / str(epoch)
            if epoch != len(self.ledger.epochs) or not checkpoint_whole(folder, epoch):
                continue
            step, values = self.pending_val.pop(epoch)
            losses = self.losses.pop(epoch, [])
            train_loss = sum(losses) / len(losses) if losses else math.nan
            tokens, seconds = self.profiled.pop(epoch, [0, 0.0])
            self.flush()  # the curve up to this checkpoint is stored before the checkpoint is
            info = CheckpointInfo(epoch=epoch, path=folder, train_loss=train_loss,
                                  val_loss=values.get("loss", math.nan), val_metrics=values, is_best=False)
            if self.on_checkpoint is not None:
                self.on_checkpoint(info)
            self.ledger.epochs.append(EpochDone(epoch=epoch, path=str(folder), train_loss=train_loss,
                                                val_metrics=values, global_step=step, profiled_tokens=int(tokens),
                                                profiled_seconds=seconds))
            ledger_save(self.out_dir, self.ledger)
            logger.info("epoch %d: train loss %.4f, val loss %.4f, checkpoint %s", epoch, train_loss,
                        values.get("loss", math.nan), folder)

    def offline_supply(self) -> dict:
        """An extraction on disk: the share of its logged steps' time speculators' trainer waited for
        its batch (its step timer's fetch_ms over step_ms, rank 0)."""
        wait, seconds, _tokens = self.waited
        return SupplyReport(hidden_states="offline", fetch_wait_seconds=wait,
                            fetch_wait_fraction=min(1.0, wait / seconds) if seconds > 0 else 0.0).as_dict()
