"""Vocab stage: token_freq.pt -> the draft vocabulary mapping speculators trains with.

Calls `speculators.train.vocab_mapping.build_vocab_mappings_from_distribution` exactly as
speculators' trainer does (`train/cli.py:_generate_vocab_mappings`: the dict from
`torch.load(token_freq_path, weights_only=True)`, the draft size, the target's vocab size) and
caches the result the same way: `np.save` of `d2t` (int64 [draft], offsets:
target_id = draft_idx + d2t[draft_idx]) and `t2d` (bool [target]) as `d2t-{N}.npy` /
`t2d-{N}.npy`, the names `train/cli.py:parse_vocab_mappings` looks for in its data path.

The builder keeps the N most frequent loss-masked tokens (ties to the lower id). When the data
holds fewer than N distinct tokens it fills the rest with the lowest token ids not already
chosen (0, 1, 2, ...), so the mapping always has exactly N entries.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from workers.contract.errors import InputError
from workers.contract.progress import ProgressFn

log = logging.getLogger(__name__)



class VocabError(InputError):
    """The sizes or the token frequency file cannot make a draft vocabulary."""


@dataclass(frozen=True)
class VocabResult:
    out_dir: Path
    d2t_path: Path
    t2d_path: Path
    draft_vocab_size: int
    target_vocab_size: int
    distinct_tokens: int  # distinct loss-masked token ids in the data
    loss_tokens: int  # loss-masked tokens counted in token_freq.pt
    covered_tokens: int  # of those, how many the draft vocabulary holds
    coverage: float  # covered_tokens / loss_tokens
    filler_tokens: int  # draft entries speculators filled with low ids the data never used

    def as_dict(self) -> dict:
        d = asdict(self)
        for key in ("out_dir", "d2t_path", "t2d_path"):
            d[key] = str(d[key])
        return d


def load_token_freq(path: Path) -> dict[int, int]:
    try:
        freq = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise VocabError(f"{path}: token frequency file not found (run the prepare stage)") from None
    except Exception as exc:  # noqa: BLE001 - a corrupt pickle raises many kinds
        raise VocabError(f"{path}: cannot read token frequencies ({exc})") from None
    if not isinstance(freq, dict) or not freq:
        raise VocabError(f"{path}: expected a non-empty dict of token id -> count")
    for tid, count in freq.items():
        if not isinstance(tid, int) or not isinstance(count, int) or tid < 0 or count < 0:
            raise VocabError(f"{path}: bad entry {tid!r}: {count!r}; ids and counts must be non-negative ints")
    return freq


def build_vocab(
    *,
    token_freq_path: Path,
    out_dir: Path,
    draft_vocab_size: int,
    target_vocab_size: int,
    on_progress: ProgressFn | None = None,
) -> VocabResult:
    """Write d2t-{N}.npy and t2d-{N}.npy for the N most frequent supervised tokens."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    token_freq_path, out_dir = Path(token_freq_path), Path(out_dir)
    if target_vocab_size < 1 or draft_vocab_size < 1:
        raise VocabError(
            f"vocab sizes must be positive, got draft {draft_vocab_size}, target {target_vocab_size}"
        )
    if draft_vocab_size > target_vocab_size:
        raise VocabError(
            f"draft_vocab_size {draft_vocab_size} is larger than the target's vocabulary "
            f"({target_vocab_size}); use at most {target_vocab_size}"
        )
    if on_progress is not None:
        on_progress(0, 1)
    freq = load_token_freq(token_freq_path)
    too_big = max(freq)
    if too_big >= target_vocab_size:
        raise VocabError(
            f"{token_freq_path}: token id {too_big} is outside the target's vocabulary "
            f"({target_vocab_size}); was the data prepared with another tokenizer?"
        )

    d2t, t2d = build_vocab_mappings_from_distribution(
        token_freq_dict=freq,
        draft_vocab_size=draft_vocab_size,
        target_vocab_size=target_vocab_size,
    )
    if d2t.shape[0] != draft_vocab_size:
        raise VocabError(f"speculators built {d2t.shape[0]} entries, expected {draft_vocab_size}")

    out_dir.mkdir(parents=True, exist_ok=True)
    d2t_path = out_dir / f"d2t-{draft_vocab_size}.npy"
    t2d_path = out_dir / f"t2d-{draft_vocab_size}.npy"
    np.save(d2t_path, d2t.cpu().numpy())
    np.save(t2d_path, t2d.cpu().numpy())

    selected = set((torch.arange(draft_vocab_size) + d2t).tolist())
    loss_tokens = sum(freq.values())
    covered = sum(count for tid, count in freq.items() if tid in selected)
    filler = sum(1 for tid in selected if tid not in freq)
    if filler:
        log.warning(
            "only %d distinct supervised tokens for a %d-token draft vocabulary: speculators "
            "filled %d entries with the lowest unused token ids",
            len(freq), draft_vocab_size, filler,
        )
    result = VocabResult(
        out_dir=out_dir,
        d2t_path=d2t_path,
        t2d_path=t2d_path,
        draft_vocab_size=draft_vocab_size,
        target_vocab_size=target_vocab_size,
        distinct_tokens=len(freq),
        loss_tokens=loss_tokens,
        covered_tokens=covered,
        coverage=covered / loss_tokens if loss_tokens else 0.0,
        filler_tokens=filler,
    )
    if on_progress is not None:
        on_progress(1, 1)
    log.info(
        "draft vocabulary %d of %d covers %.1f%% of %d supervised tokens",
        draft_vocab_size, target_vocab_size, 100 * result.coverage, loss_tokens,
    )
    return result
