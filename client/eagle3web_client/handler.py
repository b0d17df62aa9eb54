"""Eagle3WebMetricsHandler: speculators' metric records, as its trainer logs them, sent to an eagle3web run.

speculators 0.9's Trainer (speculators/train/trainer.py) logs dicts on the logger `speculators.metrics`:
- per logged step: {"train": {loss, loss_k, full_acc_k, cond_acc_k per TTT step k, error_records_*},
  "profile": {step_ms, tokens_per_s, ...} or None, "epoch", "lr" (a float, or {optimizer: lr} with muon),
  "global_step" (before the step)}, extra step = global_step;
- per epoch: {"val": {the same keys + "_epoch"}, "epoch"}, extra step = the steps done;
- once: the resolved config with extra hparams=True (speculators.train.logger.log_run_config).
They become points named as the dashboard's own trainings name theirs (workers.stages.train.loop and
workers.stages.train.with_speculators.trainer), so a comparison lines an external run up with pipeline
runs: split "train" at step global_step + 1 with loss, loss_k, full_acc_k, cond_acc_k, lr (AdamW's under
muon) and tokens_per_s (the profile's); split "val" at the record's step with the same keys, "_epoch"
dropped. `epoch`: the epoch a train step belongs to (0-based: speculators does not say how far into it
the step is, where the dashboard's own put train points at the fraction done), epoch + 1 for validation
as the dashboard's own. Hyperparameter records are not points: the last one is kept in `handler.hparams` and counted in
`skipped_records`, as are records of any other shape; non-finite values are counted in `skipped_values`.
speculators' "Checkpoint saved to <save_path>/<epoch>" log line (logger `speculators`) names a checkpoint
(`register_checkpoints=True`); it is registered once the trainer has moved past it (the first train
record of a later epoch, or close()), after the points logged before that: speculators saves the folder,
then validates and writes val_metrics.json into it, which the dashboard reads when it registers it.

Sending happens on a background thread, in batches of `batch_size` points or every `flush_seconds`,
through Client.runs.log_metrics (retried with backoff; the server keeps one point per key, split and
step, so a retried batch is not doubled). Nothing raises into the trainer: a batch that still fails is
counted in `failed_points` and reported with a warning on the logger `eagle3web_client`. close() and
flush() send what was logged and wait for it; at interpreter exit the thread sends what is left and ends.

speculators' setup_metric_logger is a dictConfig that replaces the handlers of `speculators.metrics`, and
setup_root_logger puts a RichHandler on the root logger whose filter rewrites each record's dict into text.
install() therefore puts this handler on the root logger ahead of that one, taking only speculators'
records: call it after speculators.train.logger.setup_root_logger() (logging.basicConfig does nothing
once the root logger has a handler).
"""
from __future__ import annotations

import atexit
import logging
import math
import os
import queue
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from eagle3web_client.client import ApiError, Client

METRICS_LOGGER = "speculators.metrics"
SPECULATORS_LOGGER = "speculators"
METRIC_KEY = re.compile(r"^(loss|loss_\d+|full_acc_\d+|cond_acc_\d+)$")  # workers.stages.train.results.METRIC_KEY
CHECKPOINT_SAVED = re.compile(r"^Checkpoint saved to (?P<path>.+?)[/\\](?P<epoch>\d+)\s*$")
log = logging.getLogger("eagle3web_client")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # floats, ints, numpy scalars, 0-d tensors
    except (TypeError, ValueError):
        return None
    return number


def record_points(msg: Mapping[str, Any], *, step: int | None) -> tuple[list[dict], int] | None:
    """The points one speculators.metrics record stands for, and how many of its values were not finite
    (left out: JSON has no NaN); None for a record that is not a train or val record."""
    points: list[dict] = []
    skipped = 0

    def add(split: str, at: int, key: str, value: Any) -> None:
        nonlocal skipped
        number = _number(value)
        if number is None:
            return
        if not math.isfinite(number):
            skipped += 1
            return
        points.append({"key": key, "split": split, "step": at, "value": number, "epoch": epoch})

    train = msg.get("train")
    val = msg.get("val")
    epoch = _number(msg.get("epoch"))
    epoch = max(epoch, 0.0) if epoch is not None and math.isfinite(epoch) else 0.0
    if isinstance(val, Mapping):
        epoch += 1.0  # validation after epoch e is at epoch e + 1, as the dashboard's own trainings put it
    if isinstance(train, Mapping):
        at = int(msg["global_step"]) + 1 if "global_step" in msg else (int(step) + 1 if step is not None else None)
        if at is None:
            return None
        for key, value in train.items():
            if METRIC_KEY.match(key):
                add("train", at, key, value)
        lr = msg.get("lr")
        if isinstance(lr, Mapping):  # muon: {"Muon": lr, "AdamW": lr}; --lr sets AdamW's
            lr = lr.get("AdamW", next(iter(lr.values()), None))
        add("train", at, "lr", lr)
        profile = msg.get("profile")
        if isinstance(profile, Mapping) and _number(profile.get("step_ms")):
            add("train", at, "tokens_per_s", profile.get("tokens_per_s"))
        return points, skipped
    if isinstance(val, Mapping) and step is not None:
        for key, value in val.items():
            name = key.removesuffix("_epoch")
            if METRIC_KEY.match(name):
                add("val", int(step), name, value)
        return points, skipped
    return None


class Eagle3WebMetricsHandler(logging.Handler):
    def __init__(self, client: Client, run_id: int, *, batch_size: int = 1000, flush_seconds: float = 5.0,
                 register_checkpoints: bool = True, verifier: str | None = None, rank0_only: bool = True,
                 close_timeout: float = 120.0):
        super().__init__(level=logging.INFO)
        if not 1 <= batch_size <= 10_000:
            raise ValueError(f"batch_size must be from 1 to 10,000 (the server's limit), got {batch_size}")
        self.client, self.run_id = client, int(run_id)
        self.batch_size, self.flush_seconds, self.close_timeout = batch_size, flush_seconds, close_timeout
        self.register_checkpoints, self.verifier = register_checkpoints, verifier
        # torchrun sets RANK; every rank logs the same all-reduced figures, so one rank sends them.
        self.active = not rank0_only or os.environ.get("RANK", "0") == "0"
        self.sent_points = self.failed_points = self.skipped_records = self.skipped_values = 0
        self.accepted = self.unchanged = self.replaced = 0
        self.checkpoints: list[dict] = []
        self._saved: list[tuple[str, int]] = []  # saved, not yet registered: (folder, epoch)
        self.failed_checkpoints = 0
        self.hparams: dict | None = None
        self.last_error: str | None = None
        self._queue: queue.Queue = queue.Queue()
        self._finished = False
        self._reported = (0, 0)
        self._thread = threading.Thread(target=self._run, name="eagle3web-metrics", daemon=True)
        if self.active:
            self._thread.start()
            atexit.register(self._finish)

    def install(self, logger: logging.Logger | None = None) -> Eagle3WebMetricsHandler:
        """Put the handler first on the root logger (or `logger`), where speculators' records arrive
        untouched whatever its dictConfig does to `speculators.metrics`."""
        target = logger if logger is not None else logging.getLogger()
        if self not in target.handlers:
            target.handlers.insert(0, self)
        return self

    # logging.Handler --------------------------------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        if not self.active or self._finished:
            return
        try:
            if record.name == METRICS_LOGGER or record.name.startswith(METRICS_LOGGER + "."):
                self._metrics(record)
            elif self.register_checkpoints and (record.name == SPECULATORS_LOGGER
                                                or record.name.startswith(SPECULATORS_LOGGER + ".")):
                found = CHECKPOINT_SAVED.match(record.getMessage()) if isinstance(record.msg, str) else None
                if found:
                    self._saved.append((f"{found['path']}/{found['epoch']}", int(found["epoch"])))
        except Exception as exc:  # noqa: BLE001 - a metric must never stop the training
            self.skipped_records += 1
            self.last_error = f"{type(exc).__name__}: {exc}"

    def _metrics(self, record: logging.LogRecord) -> None:
        if not isinstance(record.msg, Mapping):
            self.skipped_records += 1  # already rewritten to text: installed after speculators' RichHandler
            return
        if getattr(record, "hparams", False):
            self.hparams = dict(record.msg)
            self.skipped_records += 1
            return
        found = record_points(record.msg, step=getattr(record, "step", None))
        if found is None:
            self.skipped_records += 1
            return
        points, non_finite = found
        self.skipped_values += non_finite
        if points:
            self._queue.put(("points", points))
        epoch = record.msg.get("epoch")
        if "train" in record.msg and isinstance(epoch, int):
            self._checkpoints_before(epoch)

    def _checkpoints_before(self, epoch: int | None) -> None:
        """Queue the saved checkpoints of epochs before `epoch` (None: all of them)."""
        keep = []
        for path, saved_epoch in self._saved:
            if epoch is None or saved_epoch < epoch:
                self._queue.put(("checkpoint", path, saved_epoch))
            else:
                keep.append((path, saved_epoch))
        self._saved = keep

    def flush(self, timeout: float | None = None) -> bool:
        """Send what is waiting and wait for it (at most `timeout` seconds); True when all was handled."""
        if not self.active or not self._thread.is_alive():
            return True
        done = threading.Event()
        self._queue.put(("flush", done))
        return done.wait(self.close_timeout if timeout is None else timeout)

    def close(self) -> None:
        """Send everything logged so far and wait for it; report what was not stored.

        The handler keeps working after close(): speculators' setup_metric_logger is a dictConfig, and
        dictConfig closes every handler that exists (logging.config's _clearExistingHandlers) before the
        trainer logs its first metric through them. The sending thread ends at interpreter exit, after
        sending what is left."""
        self._checkpoints_before(None)
        if not self.flush():
            log.warning("eagle3web: gave up waiting %.0f s for the metric batches of run %d", self.close_timeout,
                        self.run_id)
        self._report()
        super().close()

    def _finish(self) -> None:
        """At interpreter exit: send what is left, then stop the thread; later records are not sent."""
        if self.active and not self._finished:
            self._checkpoints_before(None)
            self._finished = True
            done = threading.Event()
            self._queue.put(("stop", done))
            if self._thread.is_alive() and not done.wait(self.close_timeout):
                log.warning("eagle3web: gave up waiting %.0f s for the last metric batches of run %d",
                            self.close_timeout, self.run_id)
            self._report()

    def _report(self) -> None:
        failed = (self.failed_points, self.failed_checkpoints)
        if any(failed) and failed != self._reported:
            self._reported = failed
            log.warning("eagle3web: %d metric points and %d checkpoints of run %d were not stored (last error: %s)",
                        self.failed_points, self.failed_checkpoints, self.run_id, self.last_error)

    # the sending thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        pending: list[dict] = []
        since: float | None = None
        while True:
            timeout = None if since is None else max(0.0, since + self.flush_seconds - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                self._send(pending)
                pending, since = [], None
                continue
            kind = item[0]
            if kind == "points":
                pending += item[1]
                since = since if since is not None else time.monotonic()
                while len(pending) >= self.batch_size:
                    self._send(pending[:self.batch_size])
                    pending = pending[self.batch_size:]
                if not pending:
                    since = None
                continue
            self._send(pending)  # what was logged before a checkpoint, a flush or the end goes first
            pending, since = [], None
            if kind == "checkpoint":
                self._checkpoint(path=item[1], epoch=item[2])
            else:
                item[1].set()
                if kind == "stop":
                    return

    def _send(self, points: list[dict]) -> None:
        if not points:
            return
        try:
            answer = self.client.runs.log_metrics(self.run_id, points)
        except Exception as exc:  # noqa: BLE001 - counted and reported, never raised into the trainer
            self.failed_points += len(points)
            self.last_error = str(exc)
            log.warning("eagle3web: %d metric points for run %d not stored after retries: %s (%d so far)",
                        len(points), self.run_id, exc, self.failed_points)
            return
        self.sent_points += len(points)
        self.accepted += answer["accepted"]
        self.unchanged += answer["unchanged"]
        self.replaced += answer["replaced"]

    def _checkpoint(self, *, path: str, epoch: int) -> None:
        try:
            self.checkpoints.append(self.client.runs.register_checkpoint(self.run_id, path=path, epoch=epoch,
                                                                        verifier=self.verifier))
        except ApiError as exc:
            self.failed_checkpoints += 1
            self.last_error = str(exc)
            log.warning("eagle3web: checkpoint %s (epoch %d) of run %d not registered: %s", path, epoch, self.run_id, exc)
        except Exception as exc:  # noqa: BLE001
            self.failed_checkpoints += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("eagle3web: checkpoint %s of run %d not registered: %s", path, self.run_id, exc)
