"""What speculators' trainer will do with a run's rows, worked out before it starts.

The figures the training result reports (steps, tokens, supervised tokens per epoch) cannot be read
back from its logs, which hold rank 0's share only; they follow from its own code, called here with
the arguments `train/cli.py main` gives it:
- the split (`train/data.py ArrowDataset.__init__`): rows [0, int(n * train_data_ratio)) of the data
  directory train, the rest validate; by position only, whatever the seed. So the split is ours
  (workers.stages.train.holdout.split: by conversation with the run's seed, held out by prompt content) and
  speculators reads the rows in split order, train conversations first (with_speculators/split_data.py
  writes that directory), with a ratio whose boundary falls exactly between the two sides: no
  conversation has rows on both;
- the steps (`train/dataloader.py _setup_dataloader`): `MultipackDistributedBatchSamplerV2` over
  the train rows' `seq_len`, `num_replicas` = the number of processes, the run's seed, `set_epoch(e)`
  each epoch (`Trainer.train_epoch`); every rank takes one batch per step, and a tail of fewer rows
  than ranks is left out of the epoch;
- the supervised tokens that reach the loss: `shift_batch` drops each row's first position, so a
  row gives sum(loss_mask[1:]); the budget (`--total-seq-len`) is at least the longest row, so the
  sampler clips no row and `CollateFn` cuts nothing (it would otherwise, with only a warning).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workers.stages.train.holdout.split import SplitInfo, split_record, split_train_val

DEFAULT_TOTAL_SEQ_LEN = 8192  # speculators' --total-seq-len default (train/config/schema.py DataArgs)


@dataclass(frozen=True)
class RowFacts:
    lengths: list[int]
    loss_after_first: list[int]  # sum(loss_mask[1:]) per row
    source_ids: list[str] | None
    prompt_keys: list[str | None] | None = None  # workers.stages.train.holdout.prompt_keys, per row

    def in_order(self, order: list[int]) -> RowFacts:
        """The same facts for the rows as speculators reads them: position p holds prepared row order[p]."""
        def pick(values):
            return None if values is None else [values[i] for i in order]

        return RowFacts(lengths=pick(self.lengths), loss_after_first=pick(self.loss_after_first),
                        source_ids=pick(self.source_ids), prompt_keys=pick(self.prompt_keys))


@dataclass(frozen=True)
class SpeculatorsSplit:
    order: list[int]  # the prepared row at each position of the data speculators reads: train rows, then val rows
    train_rows: int  # positions [0, train_rows) train, the rest validate
    info: SplitInfo
    record: dict  # what split.json holds, in prepared-row indices (the evaluate stage reads prompts by them)

    @property
    def train_data_ratio(self) -> float:
        """speculators' --train-data-ratio: int(n * ratio) is train_rows exactly (half a row of margin
        either side, so no float rounding moves the boundary into a conversation)."""
        return (self.train_rows + 0.5) / len(self.order)


@dataclass(frozen=True)
class SpeculatorsPlan:
    total_seq_len: int
    world_size: int
    train_rows: int  # rows [0, train_rows) train; the rest validate
    steps_per_epoch: list[int]
    step_tokens: list[list[int]]  # per epoch, per step: tokens over all ranks
    loss_tokens_per_epoch: list[int]  # supervised tokens reaching the loss, all ranks
    rows_left_out: list[int]  # per epoch: train rows no rank gets (a tail shorter than the rank count)
    loss_tokens_available: int  # over the train rows
    rows_unusable: int  # train rows under 2 tokens: nothing left after shift_batch

    @property
    def total_steps(self) -> int:
        return sum(self.steps_per_epoch)

    def steps_before(self, epoch: int) -> int:
        return sum(self.steps_per_epoch[:epoch])

    def tokens_through(self, epoch: int, local_step: int) -> int:
        """Tokens trained from the start through `local_step` (1-based) of `epoch`."""
        return sum(sum(t) for t in self.step_tokens[:epoch]) + sum(self.step_tokens[epoch][:local_step])


def read_rows(prepared_dir: Path) -> RowFacts:
    from datasets import load_from_disk

    from workers.stages.train.data import TrainInputError, _mask_sums_after_first
    from workers.stages.train.holdout.prompt_keys import prompt_context_keys

    try:
        rows = load_from_disk(str(prepared_dir))
    except FileNotFoundError as exc:
        raise TrainInputError(f"{prepared_dir}: not a datasets save_to_disk directory ({exc})") from None
    missing = {"input_ids", "loss_mask", "seq_len"} - set(rows.column_names)
    if missing:
        raise TrainInputError(f"{prepared_dir}: prepared dataset lacks columns {sorted(missing)}")
    plain = rows.with_format(None)
    source_ids = [str(s) for s in plain["source_id"]] if "source_id" in rows.column_names else None
    return RowFacts(lengths=[int(n) for n in plain["seq_len"]], loss_after_first=_mask_sums_after_first(rows),
                    source_ids=source_ids, prompt_keys=prompt_context_keys(rows))


def speculators_split(source_ids: list[str] | None, *, num_rows: int, val_fraction: float, seed: int,
                      prompt_keys: list[str | None] | None) -> SpeculatorsSplit:
    """Our split (workers.stages.train.holdout.split, the same rule and seed as our loop), laid out for
    speculators' split by position: the train rows first, then the validation rows, each side in
    prepared order."""
    train_idx, val_idx, info = split_train_val(source_ids, val_fraction=val_fraction, seed=seed, num_rows=num_rows,
                                               prompt_keys=prompt_keys)
    split = SpeculatorsSplit(order=train_idx + val_idx, train_rows=len(train_idx), info=info,
                             record=split_record(train_idx, val_idx, info, source_ids))
    boundary = int(len(split.order) * split.train_data_ratio)  # ArrowDataset.__init__'s own expression
    assert boundary == split.train_rows, (boundary, split.train_rows)
    return split


def plan_epochs(rows: RowFacts, *, train_rows: int, total_seq_len: int, world_size: int, seed: int,
                epochs: int) -> SpeculatorsPlan:
    """`rows` as speculators reads them (`RowFacts.in_order(split.order)`): its sampler sees positions."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    lengths = rows.lengths[:train_rows]
    longest = max(lengths)
    if total_seq_len < longest:
        raise ValueError(f"total_seq_len {total_seq_len} is below the longest train row ({longest} tokens); "
                         "speculators would clip that row and cut its reply off")
    steps, step_tokens, loss_tokens, left_out = [], [], [], []
    for epoch in range(epochs):
        per_rank = []
        for rank in range(world_size):
            sampler = MultipackDistributedBatchSamplerV2(batch_max_length=total_seq_len, lengths=lengths,
                                                         num_replicas=world_size, rank=rank, seed=seed)
            sampler.set_epoch(epoch)
            per_rank.append([[int(i) for i in batch] for batch in sampler])
        n_steps = len(per_rank[0])
        steps.append(n_steps)
        step_tokens.append([sum(lengths[i] for r in per_rank for i in r[s]) for s in range(n_steps)])
        seen = [i for r in per_rank for batch in r for i in batch]
        loss_tokens.append(sum(rows.loss_after_first[i] for i in seen))
        left_out.append(train_rows - len(set(seen)))
    return SpeculatorsPlan(
        total_seq_len=total_seq_len, world_size=world_size, train_rows=train_rows, steps_per_epoch=steps,
        step_tokens=step_tokens, loss_tokens_per_epoch=loss_tokens, rows_left_out=left_out,
        loss_tokens_available=sum(rows.loss_after_first[:train_rows]),
        rows_unusable=sum(1 for n in lengths if n < 2))


def total_seq_len_for(requested: int | None, lengths: list[int]) -> int:
    """The budget per rank and step: the requested one (or speculators' default), raised to the longest row."""
    if requested is not None and requested < 2:
        raise ValueError(f"max_tokens_per_step must be at least 2, got {requested}")
    return max(DEFAULT_TOTAL_SEQ_LEN if requested is None else requested, max(lengths, default=0))


def check_hidden_states(hidden_states_dir: Path, lengths: list[int], *, layers: int, width: int) -> str:
    """Every row's file is there with its row's token count and the run's shape (headers only);
    returns the hidden-states backend its dtype needs ("fp8" dequantizes float8 files)."""
    from workers.contract.extraction.samples import read_sample
    from workers.stages.train.data import TrainInputError

    bad: list[str] = []
    dtypes = set()
    for i, n in enumerate(lengths):
        path = Path(hidden_states_dir) / f"hs_{i}.safetensors"
        if not path.is_file():
            bad.append(f"row {i}: {path.name} missing")
            continue
        info = read_sample(i, path, want_ids=False, full=False)
        if info.error is not None:
            bad.append(f"row {i}: {info.error}")
        elif (info.tokens, info.layers, info.width) != (n, layers, width):
            bad.append(f"row {i}: [{info.tokens}, {info.layers}, {info.width}], expected [{n}, {layers}, {width}]")
        else:
            dtypes.add(info.dtype or "")
    if bad:
        raise TrainInputError(f"{hidden_states_dir}: {len(bad)} of {len(lengths)} rows have no usable hidden states "
                              f"({'; '.join(bad[:3])}); speculators would stop at the first one")
    return "fp8" if any(d.startswith("float8") for d in dtypes) else "file"
