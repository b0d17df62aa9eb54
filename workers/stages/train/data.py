"""The train stage's data side: prepared rows joined with their hidden states, packed into steps
that never cut a row, and placed on the device the stage runs on.

speculators' `MultipackDistributedBatchSamplerV2` clips a row longer than its budget to the budget
(`__init__`, truncate_long_samples=True by default, with only a `warnings.warn`), and
`CollateFn.__call__` copies only the first max_len tokens of a batch into its buffers and cuts the
last document's length to fit. A prepared row holds its reply at its end, so a cut row loses
exactly its supervised tokens. Here the budget is at least the longest row (`token_budget`),
`plan_training_steps` refuses a longer row, and `iter_batches` collates each batch at exactly its own
token count and checks that every token arrived.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import logging  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import torch  # noqa: E402
from datasets import load_from_disk  # noqa: E402
from hs_connectors.transfer import FP8Transfer  # noqa: E402
from speculators.data_generation.offline import check_hidden_states  # noqa: E402
from speculators.models.eagle3.data import shift_batch  # noqa: E402
from speculators.train.data import CollateFn  # noqa: E402
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2  # noqa: E402
from workers.contract.errors import InputError  # noqa: E402
from workers.stages.train.checkpoints.resume import dir_summary  # noqa: E402

logger = logging.getLogger(__name__)

DEFAULT_TOKENS_PER_STEP = 512  # raised to the longest prepared row; see plan_training_steps for CPU timings


class TrainInputError(InputError):
    """An input file disagrees with the others or with the target."""


class HiddenStateSamples(torch.utils.data.Dataset):
    """Row i of the prepared dataset joined with hs_{i}.safetensors, as speculators shapes it."""

    def __init__(self, *, prepared_dir: Path, hidden_states_dir: Path, layer_ids: list[int], hidden_size: int):
        self.prepared_dir = Path(prepared_dir)
        self.hidden_states_dir = Path(hidden_states_dir)
        self.num_layers = len(layer_ids)
        self.hidden_size = hidden_size
        try:
            rows = load_from_disk(str(self.prepared_dir))
        except FileNotFoundError as exc:
            raise TrainInputError(f"{self.prepared_dir}: not a datasets save_to_disk directory ({exc})") from None
        missing = {"input_ids", "loss_mask", "seq_len"} - set(rows.column_names)
        if missing:
            raise TrainInputError(f"{self.prepared_dir}: prepared dataset lacks columns {sorted(missing)}")
        self.rows = rows.with_format("torch")
        self.lengths = [int(n) for n in rows.with_format(None)["seq_len"]]
        # Only the named column is read; None for datasets written without one (older, imported).
        self.source_ids = ([str(s) for s in rows.with_format(None)["source_id"]]
                           if "source_id" in rows.column_names else None)
        self.trainable_loss_tokens = _mask_sums_after_first(rows)
        self.transfer = FP8Transfer(self.hidden_states_dir, dequantize_dtype=torch.bfloat16)

    def __len__(self) -> int:
        return len(self.rows)

    def identity(self) -> list:
        """What a training's resume fingerprint records of its hidden states (a redone extraction differs)."""
        return [str(self.hidden_states_dir.resolve()), dir_summary(self.hidden_states_dir)]

    def expect(self, rows: list[int], *, validation: bool = False) -> None:
        """The rows the trainer reads next; an extraction on disk has nothing to fetch ahead (the online
        dataset, workers.stages.train.online.samples, does)."""

    def step_values(self, seconds: float) -> dict[str, float]:
        return {}

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        path = self.hidden_states_dir / f"hs_{index}.safetensors"
        loaded = self.transfer.get_cached(index)
        if loaded is None:
            raise TrainInputError(f"{path}: missing; prepared row {index} has no hidden states")
        row = self.rows[index]
        try:
            check_hidden_states(loaded, row["input_ids"].tolist())
        except ValueError as exc:
            raise TrainInputError(f"{path}: {exc} (prepared row {index})") from None
        hs = loaded["hidden_states"]
        expected = (self.num_layers, self.hidden_size)
        if hs.ndim != 3 or tuple(hs.shape[1:]) != expected:
            raise TrainInputError(f"{path}: hidden_states shape {tuple(hs.shape)}, expected [T, {expected[0]}, {expected[1]}]")
        if row["loss_mask"].shape[0] != hs.shape[0]:
            raise TrainInputError(f"{self.prepared_dir}: row {index} loss_mask length differs from {path}")
        seq_len = hs.shape[0]
        return {
            "hidden_states": hs[:, :-1].flatten(1),
            "input_ids": loaded["token_ids"],
            "verifier_last_hidden_states": hs[:, -1],
            "loss_mask": row["loss_mask"],
            "lengths": torch.tensor([seq_len], dtype=torch.long),
            "position_ids": torch.arange(seq_len, dtype=torch.long),
        }


def _mask_sums_after_first(rows) -> list[int]:
    """Per row, sum(loss_mask[1:]), computed in Arrow without building Python lists of tokens."""
    sums: list[int] = []
    for chunk in rows.with_format("arrow")["loss_mask"].chunks:
        tail = pc.list_slice(chunk, 1)
        flat = pc.list_flatten(tail).to_numpy(zero_copy_only=False)
        parents = pc.list_parent_indices(tail).to_numpy(zero_copy_only=False)
        sums.extend(np.bincount(parents, weights=flat, minlength=len(chunk)).astype(np.int64).tolist())
    return sums


def plan_training_steps(lengths: list[int], indices: list[int], *, max_tokens: int, seed: int, epoch: int,
                        pack: bool = True) -> list[list[int]]:
    """Row indices per step: multipack bins of <= max_tokens, or one shuffled row per step.

    Measured on 2 CPU cores with the demo target (hidden 128, rows of ~48 tokens), CPU time per
    token: packing to 256 tokens is ~2x faster than one row per step, 512 ~1.7x; 1024 is no faster
    and 2048 is 3x slower, because eager attention over a packed step is dense (T x ttt*T scores,
    cross-document pairs masked but still computed). So train() packs, 512 tokens by default, but
    never below the longest row: a row longer than max_tokens is refused here, since speculators'
    sampler would clip it (and CollateFn then cut its reply off) or, with truncate_long_samples=False,
    drop it with only a warning.
    """
    indices = [i for i in indices if lengths[i] >= 2]  # shift_batch leaves nothing of a 1-token row
    too_long = [i for i in indices if lengths[i] > max_tokens]
    if too_long:  # speculators' sampler would clip them and the collator cut their replies off
        raise ValueError(f"{len(too_long)} rows are longer than max_tokens={max_tokens} (row {too_long[0]}: "
                         f"{lengths[too_long[0]]} tokens); the budget must be at least the longest row")
    if not pack:
        return [[indices[i]] for i in np.random.default_rng(seed + epoch).permutation(len(indices))]
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=max_tokens, lengths=[lengths[i] for i in indices], num_replicas=1, rank=0, seed=seed,
        truncate_long_samples=False)
    sampler.set_epoch(epoch)
    return [[indices[int(j)] for j in batch] for batch in sampler]


def iter_batches(samples: HiddenStateSamples, plan: list[list[int]], *, max_tokens: int,
                 dtype: torch.dtype = torch.float32, pad_to: Callable[[int], int] | None = None) -> Iterator[dict]:
    """Collated packed batches ([1, T, ...] tensors plus document_ids), hidden states in `dtype`.

    speculators pads every batch to total_seq_len so compiled GPU kernels see one shape; here each
    batch is collated at `pad_to(tokens)` (at least its (shifted) tokens; exactly them without
    `pad_to`), so CollateFn, which keeps only the first max_len tokens, cuts nothing; padding has
    document id -1 and loss mask 0. A plan whose rows exceed max_tokens is refused.
    """
    for rows in plan:
        items = [samples[i] for i in rows]
        tokens = sum(max(0, int(it["lengths"][0]) - 1) for it in items)
        if tokens == 0:
            continue
        if tokens + len(items) > max_tokens:
            raise ValueError(f"rows {rows} hold {tokens + len(items)} tokens, over max_tokens={max_tokens}")
        length = tokens if pad_to is None else pad_to(tokens)
        if length < tokens:
            raise ValueError(f"pad_to({tokens}) gave {length}, fewer than the step's tokens")
        collate = CollateFn(length, samples.hidden_size, num_target_layers=samples.num_layers - 1,
                            dtype=dtype, preprocess=shift_batch)
        batch = collate(items)
        batch.pop("error_records", None)
        if int((batch["document_ids"] != -1).sum()) != tokens:
            raise RuntimeError(f"collating rows {rows} kept {int((batch['document_ids'] != -1).sum())} of {tokens} tokens")
        yield batch


def token_budget(requested: int | None, lengths: list[int]) -> int:
    """Tokens per step: the requested budget (or DEFAULT_TOKENS_PER_STEP), raised to the longest row."""
    if requested is not None and requested < 2:
        raise ValueError(f"max_tokens_per_step must be at least 2, got {requested}")
    longest = max(lengths, default=0)
    budget = max(DEFAULT_TOKENS_PER_STEP if requested is None else requested, longest)
    if requested is not None and budget > requested:
        logger.warning("max_tokens_per_step %d raised to %d, the longest prepared row, so that no row is cut",
                       requested, budget)
    return budget


def batch_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32
