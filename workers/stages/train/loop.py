"""Train speculators' Eagle3DraftModel from speculators 0.9 files, on CUDA when the worker has it, else CPU.

speculators' `Trainer` needs an accelerator, so this is a small loop of our own that reuses
speculators' pieces wherever they run on a CPU and mirrors the rest line for line:

- samples: `speculators.train.data.ArrowDataset._get_raw_data` + `BaseDataset.__getitem__`
  (aux layers flattened to [T, L_aux*H], last layer as `verifier_last_hidden_states`); files are
  read with `hs_connectors.FP8Transfer`, which also dequantizes fp8 hidden states;
- alignment and packing: `speculators.models.eagle3.data.shift_batch`, `CollateFn` and
  `MultipackDistributedBatchSamplerV2`, called directly;
- the step: `speculators.train.trainer.Trainer.train_epoch` (forward, backward, clip 1.0,
  AdamW from `train.optimizers.build_optimizers`, linear warmup schedule), the forward being
  `Eagle3DraftModel.forward` rewritten for memory linear in the step (workers.stages.train.step.packed_step,
  run by workers.stages.train.step.stepper); validation: `Trainer.val_epoch`; metric ratios:
  `speculators.train.utils.normalize_counted_metrics`;
- checkpoints: `speculators.train.checkpointer.SingleGPUCheckpointer` plus
  `Trainer.maybe_save_checkpoint` / `_save_training_state` / `maybe_update_best`.

On CPU compute is fp32 without autocast and attention goes through the per-document twin (flex
attention has no backward there); bf16 hidden states are cast to fp32 as CollateFn copies them into
the batch. On CUDA, as `Trainer.train_epoch` does: model and batches on the device, batches collated
in bf16 (read ahead on a thread into pinned memory), forward under bf16 autocast, attention by
speculators' flex block mask through a compiled flex_attention, steps padded to a few lengths (the
padding is masked out of attention, loss and accuracies), KL by speculators' fused kernel.

No row is ever cut (see workers.stages.train.data): the budget per step is at least the longest
prepared row, and the result counts the supervised tokens that reached the loss in each epoch
against those in the train split. The split keeps each conversation on one side (workers.stages.train.holdout.split).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import itertools  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from speculators.train.checkpointer import SingleGPUCheckpointer  # noqa: E402
from speculators.train.utils import normalize_counted_metrics  # noqa: E402

from workers.contract.target import read_target_config, validate_layer_ids  # noqa: E402
from workers.stages.device import device_label, resolve_device  # noqa: E402
from workers.stages.train.checkpoints.epochs import clear_previous_run, save_epoch_checkpoint  # noqa: E402
from workers.stages.train.data import (  # noqa: E402
    HiddenStateSamples,
    TrainInputError,
    batch_dtype,
    iter_batches,
    plan_training_steps,
    token_budget,
)
from workers.stages.train.processes.ddp import Ranks, rank_plan, reduce_metrics, step_weights  # noqa: E402
from workers.stages.train.draft.model import build_draft_model, make_optimizer  # noqa: E402
from workers.stages.train.online.source import OnlineSource  # noqa: E402
from workers.stages.train.holdout.prompt_keys import prompt_context_keys  # noqa: E402
from workers.stages.train.results import (  # noqa: E402
    METRIC_KEY,
    CheckpointInfo,
    TrainingStopped,
    TrainResult,
    lowest_val_loss_epoch,
    offline_supply,
    public_metrics,
)
from workers.stages.train.checkpoints.resume import (  # noqa: E402
    Progress,
    discard_state,
    load_state,
    remaining_plan,
    restore,
    save_state,
    train_fingerprint,
)
from workers.stages.train.holdout.split import SplitError, split_record, split_train_val, write_split  # noqa: E402
from workers.stages.train.step.stepper import DraftStepper, prefetch  # noqa: E402


logger = logging.getLogger(__name__)

METRICS_FLUSH_SECONDS = 2.0
METRICS_FLUSH_STEPS = 50
# Besides each epoch's end, a resume state is saved this often within an epoch, so that a lost worker
# costs at most this much training (an epoch of a large dataset can take hours).
RESUME_SAVE_SECONDS = 600.0


def evaluate(stepper: DraftStepper, samples: HiddenStateSamples, plan: list[list[int]], *, max_tokens: int,
             should_stop: Callable[[], bool] | None = None, steps_done: int = 0) -> dict[str, float]:
    """Trainer.val_epoch: sum every _sum/_total over batches, divide by batch count, normalize."""
    stepper.model.eval()
    accumulated: dict[str, float] = {}
    num_batches = 0
    batches = iter_batches(samples, plan, max_tokens=max_tokens, dtype=batch_dtype(stepper.device),
                           pad_to=lambda n: stepper.step_length(n, max_tokens))
    for batch in prefetch(batches, device=stepper.device):
        if should_stop is not None and should_stop():
            raise TrainingStopped(steps_done)
        for k, v in stepper.eval_step(batch).items():
            accumulated[k] = accumulated.get(k, 0.0) + v
        num_batches += 1
    stepper.model.train()
    return normalize_counted_metrics({k: v / max(num_batches, 1) for k, v in accumulated.items()})


class _MetricSink:
    def __init__(self, on_metrics):
        self.on_metrics = on_metrics
        self.pending: list[dict] = []
        self.steps_since = 0
        self.last = time.monotonic()

    def add(self, step: int, epoch: float, split: str, values: dict[str, float]) -> None:
        self.pending.extend({"step": step, "epoch": round(epoch, 6), "split": split, "key": k, "value": float(v)}
                            for k, v in values.items())
        self.steps_since += 1
        if self.steps_since >= METRICS_FLUSH_STEPS or time.monotonic() - self.last >= METRICS_FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.pending and self.on_metrics is not None:
            self.on_metrics(self.pending)
        self.pending, self.steps_since, self.last = [], 0, time.monotonic()


def train(*, target_dir: Path, prepared_dir: Path, hidden_states_dir: Path | None, layer_ids: list[int],
          online: OnlineSource | None = None, should_stop: Callable[[], bool] | None = None, **options) -> TrainResult:
    """Train the draft (see train_on) from an extraction's `hidden_states_dir`, or, given `online`, from
    capture servers that produce each sample's hidden states when the trainer first needs it
    (workers.stages.train.online), started here and stopped when training ends."""
    target = read_target_config(target_dir)
    validate_layer_ids(layer_ids, target.num_layers)
    if online is None:
        samples = HiddenStateSamples(prepared_dir=prepared_dir, hidden_states_dir=hidden_states_dir,
                                     layer_ids=layer_ids, hidden_size=target.hidden_size)
        return train_on(samples, target_dir=target_dir, prepared_dir=prepared_dir, layer_ids=layer_ids,
                        should_stop=should_stop, **options)
    from workers.stages.train.online.samples import online_samples

    with online_samples(online=online, target_dir=target_dir, prepared_dir=prepared_dir, layer_ids=layer_ids,
                        should_stop=should_stop) as (samples, fleet):
        return train_on(samples, target_dir=target_dir, prepared_dir=prepared_dir, layer_ids=layer_ids,
                        should_stop=should_stop, supply_of=lambda seconds, tokens: samples.report(
                            train_seconds=seconds, train_tokens=tokens, servers=fleet.servers,
                            startup_seconds=fleet.startup_seconds).as_dict(), **options)


def train_on(samples: HiddenStateSamples, *, target_dir: Path, prepared_dir: Path, d2t_path: Path, t2d_path: Path,
          out_dir: Path, layer_ids: list[int], epochs: int, lr: float, ttt_steps: int, draft_vocab_size: int,
          val_fraction: float = 0.1, max_tokens_per_step: int | None = None, seed: int = 0, device: str = "auto",
          on_progress: Callable[[int, int], None] | None = None,
          on_metrics: Callable[[list[dict]], None] | None = None,
          should_stop: Callable[[], bool] | None = None,
          on_checkpoint: Callable[[CheckpointInfo], None] | None = None,
          on_resume: Callable[[int, int], None] | None = None,
          on_split: Callable[[dict], None] | None = None,
          stop_early: Callable[[], str] | None = None,
          resume_every_steps: int | None = None,
          resume_every_seconds: float | None = RESUME_SAVE_SECONDS,
          attention: str = "auto", loss_implementation: str = "auto",
          supply_of: Callable[[float, int], dict] | None = None, ranks: Ranks | None = None) -> TrainResult:
    """Train the draft; `on_checkpoint` hears of each epoch's checkpoint as soon as it is on disk
    (is_best False until the end, when the returned result marks the best). The split (by
    conversation, held out by prompt content, see workers.stages.train.holdout.split) is written to out_dir/split.json
    before training.

    A resume state (workers.stages.train.checkpoints.resume) is saved at each epoch's end and every
    `resume_every_steps` steps or `resume_every_seconds`; a later call with the same inputs continues
    from it. `on_resume(step, epochs_done)` is told where training continues (0, 0 when it starts
    afresh) before any metric is reported, so that metrics and checkpoints an earlier attempt
    reported past that point can be dropped.

    `stop_early()` is asked after every step and epoch: a non-empty answer (why) ends training there, as if
    its epochs were done, with the checkpoints saved so far; the epoch under way is dropped.

    `ranks`: this process is one of several under torchrun (workers.stages.train.processes.ddp): it trains its share
    of each step's rows under DistributedDataParallel, and only the writer saves files and reports."""
    started = time.monotonic()
    if epochs < 1 or ttt_steps < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, ttt_steps >= 1, lr > 0; got {epochs}, {ttt_steps}, {lr}")
    run_on = resolve_device(device)
    try:
        train_idx, val_idx, split = split_train_val(samples.source_ids, val_fraction=val_fraction, seed=seed,
                                                    num_rows=len(samples),
                                                    prompt_keys=prompt_context_keys(samples.rows))
    except SplitError as exc:
        raise TrainInputError(f"{prepared_dir}: {exc}") from None
    budget = token_budget(max_tokens_per_step, samples.lengths)
    rows_unusable = sum(1 for i in train_idx if samples.lengths[i] < 2)
    available = sum(samples.trainable_loss_tokens[i] for i in train_idx)
    plans = [plan_training_steps(samples.lengths, train_idx, max_tokens=budget, seed=seed, epoch=e) for e in range(epochs)]
    val_plan = plan_training_steps(samples.lengths, val_idx, max_tokens=budget, seed=0, epoch=0)
    total_steps = sum(len(p) for p in plans)
    model = build_draft_model(target_dir=target_dir, layer_ids=layer_ids, d2t_path=d2t_path, t2d_path=t2d_path,
                              draft_vocab_size=draft_vocab_size, ttt_steps=ttt_steps, seed=seed)
    model.to(run_on)
    model.train()
    stepper = DraftStepper(model, device=run_on, ttt_steps=ttt_steps, attention=attention, loss=loss_implementation)
    optimizer, scheduler = make_optimizer(model, lr=lr, total_steps=total_steps)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = train_fingerprint(
        target_dir=target_dir, prepared_dir=prepared_dir, hidden_states=samples.identity(), d2t_path=d2t_path,
        t2d_path=t2d_path, train_rows=train_idx, val_rows=val_idx, plans=plans,
        hyper={"layer_ids": list(layer_ids), "epochs": epochs, "lr": lr, "ttt_steps": ttt_steps, "seed": seed,
               "draft_vocab_size": draft_vocab_size, "val_fraction": val_fraction, "tokens_per_step": budget})
    state = load_state(out_dir, fingerprint=fingerprint)
    writer = ranks is None or ranks.writer
    if state is None:
        progress = Progress()
    else:
        progress = restore(state, model=model, optimizer=optimizer, scheduler=scheduler)
        del state
    if ranks is not None:
        torch.distributed.barrier()  # every rank has read the resume state before the writer replaces it
        stepper.distribute()
    resumed_from = progress.global_step
    if writer:
        if not resumed_from and not progress.epoch:
            discard_state(out_dir)
        clear_previous_run(out_dir, keep_epochs=progress.epoch)
    if on_resume is not None:
        on_resume(progress.global_step, progress.epoch)
    if writer:
        write_split(out_dir, split_record(train_idx, val_idx, split, samples.source_ids))
    if on_split is not None:  # the page shows the split while training runs, not only at its end
        on_split(split.as_dict())
    checkpointer = SingleGPUCheckpointer(out_dir)
    sink = _MetricSink(on_metrics)
    logger.info("training on %s (%s): %d train / %d val rows (split by %s: %d / %d conversations), %d tokens per "
                "step, %d steps over %d epochs into %s", device_label(run_on), stepper.describe(), len(train_idx),
                len(val_idx), split.by, split.train_conversations, split.val_conversations, budget, total_steps,
                epochs, out_dir)
    if progress.global_step or progress.epoch:
        logger.info("resumed from step %d (epoch %d, %d batches into it): %d of %d steps left", resumed_from,
                    progress.epoch, progress.local_step, total_steps - resumed_from, total_steps)
    if rows_unusable:
        logger.warning("%d train rows have fewer than 2 tokens and cannot be trained on", rows_unusable)

    def save_resume() -> None:
        sink.flush()  # every metric up to this state's step is handed on before the state says so
        if not writer:
            return
        if should_stop is not None and should_stop():  # a replaced attempt must not overwrite its successor's state
            raise TrainingStopped(progress.global_step)
        save_state(out_dir, fingerprint=fingerprint, model=model, optimizer=optimizer, scheduler=scheduler,
                   progress=progress)

    step, attempt_tokens, attempt_seconds, last_save = progress.global_step, 0, 0.0, time.monotonic()
    stopped_early = ""
    if on_progress is not None:
        on_progress(step, total_steps)
    try:
        for epoch in range(progress.epoch, epochs):
            plan = plans[epoch]
            todo = remaining_plan(plan, samples.lengths, progress.local_step)
            counts = itertools.repeat(True)  # on several ranks: whether this rank's rows of each step count
            if ranks is not None:
                todo, counts = rank_plan(todo, samples.lengths, ranks)
            samples.expect([row for rows in todo for row in rows])  # an online dataset fetches ahead
            batches = stepper.timed(prefetch(
                iter_batches(samples, todo, max_tokens=budget, dtype=batch_dtype(run_on),
                             pad_to=lambda n: stepper.step_length(n, budget)),
                device=run_on))
            t0 = time.perf_counter()
            for (local_step, batch), real in zip(enumerate(batches, progress.local_step + 1), counts):
                if should_stop is not None and should_stop():
                    raise TrainingStopped(step)
                lr_now = optimizer.param_groups[0]["lr"]
                tokens = int((batch["document_ids"] != -1).sum())
                loss_tokens = int(batch["loss_mask"].sum())
                if ranks is None:
                    loss, raw = stepper.train_step(batch, optimizer, scheduler)
                else:
                    weights = step_weights(batch["loss_mask"], ttt_steps=ttt_steps, real=real, world=ranks.world)
                    loss, raw = stepper.train_step(batch, optimizer, scheduler, step_weights=weights)
                    raw = reduce_metrics({**raw, "n_tokens": tokens, "n_loss_tokens": loss_tokens},
                                         weights=weights, world=ranks.world, real=real)
                    tokens, loss_tokens = int(raw.pop("n_tokens")), int(raw.pop("n_loss_tokens"))
                progress.loss_tokens += loss_tokens
                t1 = time.perf_counter()
                step, attempt_tokens, attempt_seconds = step + 1, attempt_tokens + tokens, attempt_seconds + (t1 - t0)
                progress.global_step, progress.local_step = step, local_step
                progress.train_tokens += tokens
                progress.train_seconds += t1 - t0
                values = public_metrics(raw)
                progress.losses.append(values["loss"])
                values.update(lr=lr_now, tokens_per_s=tokens / max(t1 - t0, 1e-9), tokens_seen=progress.train_tokens)
                values.update(samples.step_values(attempt_seconds))
                sink.add(step, epoch + local_step / len(plan), "train", values)
                if on_progress is not None:
                    on_progress(step, total_steps)
                if stop_early is not None and (stopped_early := stop_early()):
                    break
                if ((resume_every_steps and step % resume_every_steps == 0)
                        or (resume_every_seconds is not None and time.monotonic() - last_save >= resume_every_seconds)):
                    save_resume()
                    last_save = time.monotonic()
                t0 = time.perf_counter()
            if stopped_early:
                sink.flush()
                break
            loss_tokens = progress.loss_tokens
            progress.loss_tokens_per_epoch.append(loss_tokens)
            if loss_tokens != available:
                logger.warning("epoch %d: %d of %d supervised tokens reached the loss", epoch, loss_tokens, available)
            samples.expect([row for rows in val_plan for row in rows], validation=True)
            val = evaluate(stepper, samples, val_plan, max_tokens=budget, should_stop=should_stop, steps_done=step)
            val_public = {k: float(v) for k, v in val.items() if METRIC_KEY.match(k)}
            sink.add(step, epoch + 1.0, "val", val_public)
            sink.flush()
            # On several ranks every rank validates; torch's global rank 0 alone saves (save_epoch_checkpoint says
            # why), whichever node c10d made it, and the others wait for it.
            path = save_epoch_checkpoint(checkpointer, model, optimizer, scheduler, epoch=epoch, global_step=step,
                                         val_metrics=val, write=ranks is None or ranks.rank == 0)
            train_loss = float(np.mean(progress.losses)) if progress.losses else math.nan
            progress.epoch_rows.append([epoch, str(path), train_loss, val_public])
            logger.info("epoch %d: train loss %.4f, val loss %.4f, %d of %d supervised tokens trained, checkpoint %s",
                        epoch, train_loss, val_public.get("loss", math.nan), loss_tokens, available, path)
            if on_checkpoint is not None:
                on_checkpoint(CheckpointInfo(epoch=epoch, path=path, train_loss=train_loss,
                                             val_loss=val_public.get("loss", math.nan), val_metrics=val_public,
                                             is_best=False))
            progress.epoch, progress.local_step, progress.losses, progress.loss_tokens = epoch + 1, 0, [], 0
            save_resume()
            last_save = time.monotonic()
            if stop_early is not None and (stopped_early := stop_early()):
                break
    except TrainingStopped:
        sink.flush()
        logger.info("training stopped on request after %d steps", step)
        raise

    epoch_rows = [(e, Path(p), tl, v) for e, p, tl, v in progress.epoch_rows]
    best_epoch = lowest_val_loss_epoch({e: v.get("loss", math.inf) for e, _p, _tl, v in epoch_rows})
    if ranks is None or ranks.rank == 0:  # where the epochs were saved
        checkpointer.update_best_symlink(best_epoch)
    if ranks is not None:
        torch.distributed.barrier()  # the writer reports the best epoch once it is linked
    if not writer:
        return None  # the writer's node hands the result back
    checkpoints = [CheckpointInfo(epoch=e, path=p, train_loss=tl, val_loss=v.get("loss", math.nan), val_metrics=v,
                                  is_best=e == best_epoch) for e, p, tl, v in epoch_rows]
    tokens_per_second = (attempt_tokens / max(attempt_seconds, 1e-9) if attempt_tokens
                         else progress.train_tokens / max(progress.train_seconds, 1e-9))
    return TrainResult(out_dir=out_dir, checkpoints=checkpoints, best_epoch=best_epoch, steps=step,
                       train_tokens=progress.train_tokens, tokens_per_second=tokens_per_second,
                       seconds=time.monotonic() - started, tokens_per_step=budget, loss_tokens_available=available,
                       loss_tokens_trained=progress.loss_tokens_per_epoch[-1],
                       loss_tokens_per_epoch=list(progress.loss_tokens_per_epoch), rows_unusable=rows_unusable,
                       split=split, device=device_label(run_on), resumed_from_step=resumed_from,
                       stopped_early=stopped_early,
                       step_config=stepper.describe(), time_split_s=stepper.times.as_dict(),
                       step_lengths=sorted({length for length, _grad in stepper.shapes}),
                       graphs_compiled=stepper.graphs_compiled(), recompiles=stepper.recompiles(),
                       supply=(supply_of(attempt_seconds, attempt_tokens) if supply_of is not None
                               else offline_supply(stepper.times.as_dict(), attempt_seconds)))

