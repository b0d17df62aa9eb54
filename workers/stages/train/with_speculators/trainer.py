"""The speculators training backend: speculators 0.9's own Trainer under torchrun, one node, N GPUs.

What runs (read from the installed speculators 0.9.0, speculators/train/):
  torchrun --standalone --nproc-per-node N -m workers.stages.train.with_speculators.entry
      --verifier-name-or-path TARGET --data-path RUN/speculators_data_split --save-path RUN/checkpoints
      --target-layer-ids A B C --draft-vocab-size V --epochs E --lr LR --ttt-steps K --seed S
      --total-seq-len T --train-data-ratio R --on-missing raise --log-dir RUN/checkpoints/logs
      [--hidden-states-backend fp8] [--fsdp-shard] [extra flags]
- the entry module is `speculators/train/__main__.py` (`main(TrainConfig.resolve())`) plus a logging
  handler (workers.stages.train.with_speculators.entry); the flags are `train/config/schema.py`'s. The data
  directory holds the run's rows in our split's order, train rows first (with_speculators/split_data.py;
  R puts speculators' positional boundary exactly between the sides), beside RUN/speculators_data, the
  links into the run (workers.contract.extraction.speculators_layout): `d2t-V.npy`/`t2d-V.npy` are found there by
  `cli.py parse_vocab_mappings`, `hidden_states/` by the file backend.
- `--on-missing raise`: its default, `generate`, asks a vLLM server for hidden states it lacks; an online
  run (`online`) uses it, with an empty `hidden_states/` and one capture server (with_speculators/online.py).
- Processes: `maybe_setup_distributed` (train/distributed.py) calls init_process_group when torchrun
  set LOCAL_RANK; then `Trainer.setup_model` wraps in DDP, or FSDP2 `fully_shard` per decoder layer with
  `--fsdp-shard` (default here when N > 1; DistributedCheckpointer gathers full weights on rank 0).
  Each rank moves the model to accelerator `LOCAL_RANK`: on a host without one it stops with "Cannot
  access accelerator device when none is available" (there is no device flag), so this backend needs
  GPUs; tests run it on the CPU through a test-only seam (tests/stages/train/with_speculators/speculators_cpu_seam/).
- Metrics: per logged step (`--log-freq`, default 1) a dict on logger `speculators.metrics`:
  {"train": {loss, loss_k, full_acc_k, cond_acc_k per TTT step k, error_records}, "profile":
  {step_ms, tokens_per_s, ...}, "epoch", "lr" (a float, or {optimizer: lr} with muon), "global_step"
  (before the step)}; per epoch {"val": {same keys + "_epoch"}, "epoch"} with extra step = steps done.
  They become our points: keys as workers.stages.train.loop reports them, train step = global_step + 1.
- Checkpoints (train/trainer.py maybe_save_checkpoint, checkpointer.py): after each epoch
  `save_path/{epoch}/` (config.json with speculators_model_type "eagle3", model.safetensors with
  d2t/t2d, optimizer_state_dict.pt, scheduler_state_dict.pt, training_state.json), a link
  `epoch{e}_end`, then validation, then `val_metrics.json` and `checkpoint_best` when the loss
  improved; `run.yaml` and `train_command.txt` in save_path. One is registered when its validation
  was logged and the folder is whole; on SIGTERM it saves `interrupted/`, which it never resumes from.
- Resume: its own, from the highest finished epoch folder (see workers.stages.train.with_speculators.ledger).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from workers.stages.children.child_process import die_with_parent, guarded, stop_group
from workers.stages.train.with_speculators.entry import METRICS_PATH_ENV
from workers.contract.extraction.speculators_layout import default_data_dir, speculators_data_link
from workers.stages.train.with_speculators.ledger import ledger_open
from workers.stages.train.with_speculators.online import speculators_endpoint
from workers.stages.train.with_speculators.plan import (
    check_hidden_states,
    plan_epochs,
    read_rows,
    speculators_split,
    total_seq_len_for,
)
from workers.stages.train.with_speculators.records import MetricCapture
from workers.stages.train.with_speculators.split_data import HIDDEN_STATES, split_data_dir, write_split_data
from workers.stages.train.holdout.split import SplitError, write_split
from workers.contract.target import read_target_config, validate_layer_ids
from workers.stages.train.data import TrainInputError
from workers.stages.train.results import CheckpointInfo, TrainingStopped, TrainResult, lowest_val_loss_epoch
from workers.stages.train.online.source import OnlineSource, SupplyReport
from workers.stages.train.checkpoints.resume import dir_summary, train_fingerprint

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[4]
ENTRY_MODULE = "workers.stages.train.with_speculators.entry"
METRICS_FILE = "speculators_metrics.jsonl"
LOG_FILE = "speculators_train.log"
POLL_SECONDS = 0.5
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_METRIC_ECHO = re.compile(r"\b(train|val|profile)/\w+=")  # speculators' console copy of a metric record
_PROGRESS_BAR = re.compile(r"━|\d+%\|")  # tqdm/rich bars: in the log file, not in the stage's log lines
_RICH_SOURCE = re.compile(r"\s+\w+\.py:\d+$")  # RichHandler's right-aligned "trainer.py:739"
# httpx's line per request: online, one per sample (in the log file, not in the stage's log lines)
_HTTP_REQUEST = re.compile(r"\bHTTP Request: (GET|POST) ")


class SpeculatorsTrainError(RuntimeError):
    """speculators' trainer exited with an error; the message ends with its last log lines."""


def default_torchrun() -> str:
    found = shutil.which("torchrun") or shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if found is None:
        raise SpeculatorsTrainError("torchrun not found on PATH or beside this Python; it is installed with torch")
    return found


def speculators_command(*, torchrun: str, num_gpus: int, fsdp: bool, target_dir: Path, data_dir: Path,
                        out_dir: Path, aux_layer_ids: Sequence[int], draft_vocab_size: int, epochs: int, lr: float,
                        ttt_steps: int, seed: int, total_seq_len: int, train_data_ratio: float,
                        hidden_states_backend: str = "file", extra_args: Sequence[str] = (),
                        online_flags: Sequence[str] = (), node_args: Sequence[str] = ()) -> list[str]:
    """`online_flags` (with_speculators/online.py endpoint_flags) replace `--on-missing raise`. `node_args`
    (workers.stages.train.processes.nodes.torchrun_args): one node of several, in place of --standalone on one."""
    placement = list(node_args) or ["--standalone", "--nproc-per-node", str(num_gpus)]
    command = [torchrun, *placement, "-m", ENTRY_MODULE,
               "--verifier-name-or-path", str(target_dir), "--data-path", str(data_dir), "--save-path", str(out_dir),
               "--target-layer-ids", *[str(i) for i in aux_layer_ids], "--draft-vocab-size", str(draft_vocab_size),
               "--epochs", str(epochs), "--lr", repr(float(lr)), "--ttt-steps", str(ttt_steps), "--seed", str(seed),
               "--total-seq-len", str(total_seq_len), "--train-data-ratio", repr(train_data_ratio),
               *(online_flags or ("--on-missing", "raise")), "--log-dir", str(Path(out_dir) / "logs")]
    if hidden_states_backend != "file":
        command += ["--hidden-states-backend", hidden_states_backend]
    if fsdp:
        command.append("--fsdp-shard")
    return command + list(extra_args)


class _Trainer:
    """The torchrun process group: its output copied to a log file and our logger, stopped on request."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict, log_path: Path):
        self.log_path = log_path
        self.tail: collections.deque[str] = collections.deque(maxlen=60)
        self.log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in wait()
        self.log.write(f"$ {' '.join(command)}\n")
        self.proc = subprocess.Popen(guarded(command), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", start_new_session=True,
                                     preexec_fn=die_with_parent())  # torchrun passes SIGTERM on to its ranks
        self.reader = threading.Thread(target=self._read, name="speculators-output", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            line = _ANSI.sub("", raw).rstrip()
            self.log.write(line + "\n")
            self.log.flush()
            if line.strip():
                self.tail.append(line)
                if not (_METRIC_ECHO.search(line) or _PROGRESS_BAR.search(line) or _HTTP_REQUEST.search(line)):
                    logger.info("speculators: %s", " ".join(_RICH_SOURCE.sub("", line).split()))

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM to torchrun and every rank (speculators saves `interrupted/` and exits), SIGKILL
        to what is left after the grace period."""
        if stop_group(self.proc, grace_seconds):
            logger.warning("speculators did not stop within %.0f s of SIGTERM; killed it", grace_seconds)

    def wait(self) -> int:
        rc = self.proc.wait()
        self.reader.join(timeout=10)
        self.log.close()
        return rc


def train_with_speculators(
        *, target_dir: Path, prepared_dir: Path, hidden_states_dir: Path | None, d2t_path: Path, t2d_path: Path,
        out_dir: Path, layer_ids: list[int], epochs: int, lr: float, ttt_steps: int, draft_vocab_size: int,
        num_gpus: int = 1, seed: int = 0, val_fraction: float = 0.1, max_tokens_per_step: int | None = None,
        fsdp: bool | None = None, data_dir: Path | None = None, extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None, stop_grace_seconds: float = 20.0,
        on_progress: Callable[[int, int], None] | None = None,
        on_metrics: Callable[[list[dict]], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_checkpoint: Callable[[CheckpointInfo], None] | None = None,
        on_resume: Callable[[int, int], None] | None = None,
        on_split: Callable[[dict], None] | None = None,
        torchrun_executable: str | None = None, online: OnlineSource | None = None,
        node_args: Sequence[str] = ()) -> TrainResult:
    """Train the draft with speculators' Trainer; same callbacks and result as workers.stages.train.loop.train.

    `data_dir` (default: beside out_dir, `speculators_data`) is (re)written as links to the run's
    files, and `<data_dir>_split` as the rows in split order that speculators trains on. `fsdp` None
    shards with FSDP when num_gpus > 1. `extra_args` go to speculators as they are (e.g. --optimizer
    adamw, --num-workers 4). `env` is added to the trainer's environment.
    On a retry speculators resumes from the last finished epoch and `on_resume(step, epochs_done)`
    says so before any metric is reported. Given `online`, `hidden_states_dir` is not read: speculators
    asks the run's first capture server for every sample (with_speculators/online.py), started (or
    reached and checked) before torchrun and stopped when it ends, and the result's `supply` says what
    was measured of it."""
    started = time.monotonic()
    if epochs < 1 or ttt_steps < 1 or lr <= 0 or num_gpus < 1:
        raise ValueError(f"need epochs, ttt_steps, num_gpus >= 1 and lr > 0; got {epochs}, {ttt_steps}, {num_gpus}, {lr}")
    out_dir = Path(out_dir).absolute()
    target = read_target_config(target_dir)
    layer_ids = validate_layer_ids(list(layer_ids), target.num_layers)
    rows = read_rows(prepared_dir)
    if online is None:
        backend = check_hidden_states(hidden_states_dir, rows.lengths, layers=len(layer_ids), width=target.hidden_size)
        identity = [str(Path(hidden_states_dir).resolve()), dir_summary(Path(hidden_states_dir))]
    else:  # the links folder points at the online cache folder: an online run's samples, in prepared order
        backend, hidden_states_dir = "file", Path(online.cache_dir)
        hidden_states_dir.mkdir(parents=True, exist_ok=True)
        identity = ["online", str(hidden_states_dir.resolve())]  # as the online loop's: the source, not its files
    data = speculators_data_link(prepared_dir=prepared_dir, hidden_states_dir=hidden_states_dir, d2t_path=d2t_path,
                                 t2d_path=t2d_path, out_dir=data_dir or default_data_dir(out_dir.parent))
    if data.draft_vocab_size != draft_vocab_size:
        raise TrainInputError(f"{d2t_path}: {data.draft_vocab_size} entries, but draft_vocab_size is {draft_vocab_size}")
    try:
        split = speculators_split(rows.source_ids, num_rows=len(rows.lengths), val_fraction=val_fraction, seed=seed,
                                  prompt_keys=rows.prompt_keys)
    except SplitError as exc:
        raise TrainInputError(f"{prepared_dir}: {exc}") from None
    train_rows = split.train_rows
    total_seq_len = total_seq_len_for(max_tokens_per_step, rows.lengths)
    plan = plan_epochs(rows.in_order(split.order), train_rows=train_rows, total_seq_len=total_seq_len,
                       world_size=num_gpus, seed=seed, epochs=epochs)
    fsdp = num_gpus > 1 if fsdp is None else fsdp
    fingerprint = train_fingerprint(
        target_dir=target_dir, prepared_dir=prepared_dir,
        hidden_states=identity, d2t_path=d2t_path,
        t2d_path=t2d_path, train_rows=split.order[:train_rows], val_rows=split.order[train_rows:],
        plans=[], hyper={"backend": "speculators", "layer_ids": layer_ids, "epochs": epochs, "lr": lr,
                         "ttt_steps": ttt_steps, "seed": seed, "draft_vocab_size": draft_vocab_size,
                         "total_seq_len": total_seq_len, "world_size": num_gpus, "extra_args": list(extra_args)})
    ledger = ledger_open(out_dir, fingerprint=fingerprint)
    resumed_from = ledger.global_step
    if on_resume is not None:
        on_resume(resumed_from, len(ledger.epochs))
    write_split(out_dir, split.record)
    if on_split is not None:  # the page shows the split while training runs, not only at its end
        on_split(split.info.as_dict())
    metrics_path = out_dir / METRICS_FILE
    metrics_path.unlink(missing_ok=True)
    capture = MetricCapture(path=metrics_path, plan=plan, out_dir=out_dir, ledger=ledger, on_metrics=on_metrics,
                            on_checkpoint=on_checkpoint, on_progress=on_progress, online=online is not None)
    if on_progress is not None:
        on_progress(resumed_from, plan.total_steps)
    loss_args, step_config = speculators_loss_args(extra_args)
    logger.info("speculators' trainer: %s", step_config)
    supply = SupplyReport(hidden_states="offline" if online is None else "online",
                          advice="every epoch was trained by an earlier attempt: nothing to measure").as_dict()
    if len(ledger.epochs) < epochs:
        ordered = write_split_data(prepared_dir=prepared_dir, links_dir=data.data_dir, order=split.order,
                                   hidden_states_dir=None if online is not None else hidden_states_dir,
                                   out_dir=split_data_dir(data.data_dir))
        command = functools.partial(
            speculators_command, torchrun=torchrun_executable or default_torchrun(), num_gpus=num_gpus, fsdp=fsdp,
            target_dir=target_dir, data_dir=ordered, out_dir=out_dir, aux_layer_ids=layer_ids[:-1],
            draft_vocab_size=draft_vocab_size, epochs=epochs, lr=lr, ttt_steps=ttt_steps, seed=seed,
            total_seq_len=total_seq_len, train_data_ratio=split.train_data_ratio,
            hidden_states_backend=backend, extra_args=[*loss_args, *extra_args], node_args=node_args)
        run = functools.partial(_run, capture=capture, out_dir=out_dir, env=env, should_stop=should_stop,
                                stop_grace_seconds=stop_grace_seconds)
        if online is None:
            run(command())
            supply = capture.offline_supply()
        else:
            with speculators_endpoint(online, target_dir=target_dir, layer_ids=layer_ids, prepared_dir=prepared_dir,
                                      lengths=rows.lengths, hidden_states_folder=ordered / HIDDEN_STATES,
                                      should_stop=should_stop) as source:
                source.start_counting()
                try:
                    run(command(online_flags=source.flags), on_poll=source.disk.sample, env={**(env or {}), **source.env})
                except SpeculatorsTrainError as exc:  # a dead server shows as samples it could not produce
                    raise SpeculatorsTrainError(f"{exc}\n{source.endpoint_state()}") from None
                fetch_seconds, step_seconds, step_tokens = capture.waited
                supply = source.supply(fetch_seconds=fetch_seconds, step_seconds=step_seconds, step_tokens=step_tokens)
    result = _result(capture, plan=plan, split=split.info, epochs=epochs, out_dir=out_dir, num_gpus=num_gpus, fsdp=fsdp,
                     resumed_from=resumed_from, seconds=time.monotonic() - started)
    return dataclasses.replace(result, step_config=step_config, supply=supply)


def speculators_loss_args(extra_args: Sequence[str]) -> tuple[list[str], str]:
    """(flags to add, what the run's summary says). speculators 0.9's fused loss fails under dynamo
    with torch 2.11 (on an H200: "AssertionError: ListVariable(length=21) is already tracked for
    mutation" in speculators/losses/fused.py), which ended the run; its compiled forward with the eager
    loss trained there (bench/gpu/gpu_check.py, 2026-12-04). So eager is the default; a
    --loss-implementation among the worker's or the run's flags wins."""
    if any(a == "--loss-implementation" or a.startswith("--loss-implementation=") for a in extra_args):
        return [], "speculators' compiled forward, loss implementation as given in its flags"
    return (["--loss-implementation", "eager"],
            "speculators' compiled forward, eager loss (its fused loss fails under dynamo with torch 2.11)")


def _run(command: list[str], *, capture: MetricCapture, out_dir: Path, env, should_stop, stop_grace_seconds: float,
         on_poll: Callable[[], None] | None = None) -> None:
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (child_env.get("PYTHONPATH"), str(REPO_ROOT)) if p)
    child_env.update({METRICS_PATH_ENV: str(capture.path), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    child_env.setdefault("HF_HUB_OFFLINE", "1")
    logger.info("starting speculators' trainer: %s", " ".join(command))
    trainer = _Trainer(command, cwd=out_dir, env=child_env, log_path=out_dir / LOG_FILE)
    try:
        while trainer.proc.poll() is None:
            time.sleep(POLL_SECONDS)
            capture.poll()
            if on_poll is not None:
                on_poll()
            if should_stop is not None and should_stop():
                trainer.stop(stop_grace_seconds)
                trainer.wait()
                capture.poll()
                raise TrainingStopped(capture.step)
    except BaseException:
        if trainer.proc.poll() is None:  # an error of ours (a callback's): the trainer must not outlive it
            trainer.stop(stop_grace_seconds)
        raise
    rc = trainer.wait()
    capture.poll()
    if rc != 0:
        tail = "\n".join(trainer.tail)
        raise SpeculatorsTrainError(f"speculators' trainer exited with code {rc}; the end of its log "
                                    f"({trainer.log_path}):\n{tail}")


def _result(capture: MetricCapture, *, plan, split, epochs: int, out_dir: Path, num_gpus: int, fsdp: bool,
            resumed_from: int, seconds: float) -> TrainResult:
    done = capture.ledger.epochs
    if len(done) != epochs:
        raise SpeculatorsTrainError(f"speculators' trainer finished, but {len(done)} of {epochs} epochs have a "
                                    f"checkpoint and a validation in {out_dir}; see {out_dir / LOG_FILE}")
    if capture.dropped_samples:
        logger.warning("speculators dropped %d samples (hidden states unreadable or not matching their rows): "
                       "the supervised-token counts assume every row trained", round(capture.dropped_samples))
    if done[-1].global_step != plan.total_steps:
        logger.warning("speculators trained %d steps where its sampler gave %d (extra flags such as --max-steps?): "
                       "the token counts reported are the sampler's", done[-1].global_step, plan.total_steps)
    if any(plan.rows_left_out):
        logger.warning("speculators' sampler left %d train rows out of each epoch (fewer than %d processes)",
                       max(plan.rows_left_out), num_gpus)
    best = lowest_val_loss_epoch({e.epoch: e.val_metrics.get("loss", math.inf) for e in done})
    best_link = out_dir / "checkpoint_best"
    if not best_link.is_symlink() or best_link.readlink() != Path(str(best)):
        best_link.unlink(missing_ok=True)  # a resumed speculators chose among its own epochs only
        best_link.symlink_to(Path(str(best)), target_is_directory=True)
    checkpoints = [CheckpointInfo(epoch=e.epoch, path=Path(e.path), train_loss=e.train_loss,
                                  val_loss=e.val_metrics.get("loss", math.nan), val_metrics=e.val_metrics,
                                  is_best=e.epoch == best) for e in done]
    # This attempt's throughput, as workers.stages.train.loop reports it; the earlier attempts' when none was left.
    timed = [e for e in done if e.global_step > resumed_from] or done
    tokens, spent = sum(e.profiled_tokens for e in timed), sum(e.profiled_seconds for e in timed)
    ran_on = capture.device or "the earlier attempt's devices"
    device = f"{num_gpus} x {ran_on} (speculators, torchrun{', FSDP' if fsdp else ''})"
    return TrainResult(out_dir=out_dir, checkpoints=checkpoints, best_epoch=best, steps=done[-1].global_step,
                       train_tokens=sum(sum(t) for t in plan.step_tokens), tokens_per_second=tokens / spent if spent else 0.0,
                       seconds=seconds, tokens_per_step=plan.total_seq_len,
                       loss_tokens_available=plan.loss_tokens_available,
                       loss_tokens_trained=plan.loss_tokens_per_epoch[-1],
                       loss_tokens_per_epoch=list(plan.loss_tokens_per_epoch), rows_unusable=plan.rows_unusable,
                       split=split, device=device[:100], resumed_from_step=resumed_from)
