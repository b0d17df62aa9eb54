"""What torchrun runs for the speculators training backend: speculators.train's own entry point
(`speculators/train/__main__.py`: `main(TrainConfig.resolve())`, the flags from argv) plus one
logging handler that writes its metric records, as they are logged, to a JSON-lines file.

speculators logs metrics as dicts on the `speculators.metrics` logger (train/trainer.py
train_epoch and val_epoch) and sends them only to the backends `--logger` names (tensorboard,
wandb, trackio, mlflow: train/logger.py setup_metric_logger, a dictConfig that replaces that
logger's handlers). The records also propagate to the root logger, where `setup_root_logger` puts a
RichHandler whose FormatDictFilter rewrites `record.msg` into text rounded to 3 decimals. So the
handler goes on the root logger *before* that one and writes the dict untouched; with rank 0 only
(as speculators' IsRank0Filter), since every rank logs the same all-reduced figures.

A line: {"time": unix seconds, "step": the record's `extra={"step": ...}`, "record": the dict}; the
first line names rank 0's device instead: {"time": ..., "device": "NVIDIA H200"} ("cpu" without CUDA).
Hyperparameter records (`extra={"hparams": True}`, the resolved config) are not written: run.yaml
beside the checkpoints holds it. Nothing else of speculators is changed, but for an online run: its
hidden-states files are taken only from the capture server's staging folder, and its client follows no
redirect (with_speculators.confine, installed when the stage sets its environment variable).
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping

METRICS_PATH_ENV = "EAGLE3WEB_METRICS_PATH"
METRICS_LOGGER = "speculators.metrics"


def _plain(value):
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    try:
        number = float(value)  # floats, numpy scalars, 0-d tensors
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else str(number)  # "nan"/"inf": JSON has no such numbers


class MetricRecordWriter(logging.Handler):
    def __init__(self, path: str):
        super().__init__(level=logging.INFO)
        self.stream = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - lives as long as the process

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != METRICS_LOGGER or not isinstance(record.msg, Mapping) or getattr(record, "hparams", False):
            return
        try:
            line = json.dumps({"time": record.created, "step": getattr(record, "step", None),
                               "record": _plain(record.msg)})
            self.stream.write(line + "\n")  # one write per line: the reader takes only whole lines
        except Exception:  # noqa: BLE001 - a metric must never stop the training
            self.handleError(record)


def install(path: str) -> MetricRecordWriter:
    from speculators.train.logger import setup_root_logger

    setup_root_logger()  # as speculators' main does first; its own second call is then a no-op
    writer = MetricRecordWriter(path)
    logging.getLogger().handlers.insert(0, writer)  # ahead of the RichHandler that rewrites the dict
    writer.stream.write(json.dumps({"time": time.time(), "device": _device_name()}) + "\n")
    return writer


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(int(os.environ.get("LOCAL_RANK", "0")))
    return "cpu"


def main() -> None:
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    from workers.stages.train.with_speculators.confine import install_from_environment

    path = os.environ.get(METRICS_PATH_ENV)
    if path and os.environ.get("RANK", "0") == "0":
        install(path)
    install_from_environment()
    train_main(TrainConfig.resolve())


if __name__ == "__main__":
    main()
