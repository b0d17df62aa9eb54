"""The vocab stage: d2t/t2d built by speculators' builder, cached as speculators caches them."""
from collections import Counter

import numpy as np
import pytest
import torch

from workers.stages.vocab import VocabError, build_vocab

TARGET_VOCAB = 50


def _freq_file(tmp_path, freq: dict[int, int]):
    path = tmp_path / "token_freq.pt"
    torch.save(dict(freq), path)  # what speculators' save_token_frequency_distribution writes
    return path


def _build(path, tmp_path, draft: int, **kwargs):
    return build_vocab(token_freq_path=path, out_dir=tmp_path / "v", draft_vocab_size=draft,
                       target_vocab_size=TARGET_VOCAB, **kwargs)


@pytest.fixture
def skewed(tmp_path):
    # ids 40..49 common, 0..9 rare, 20 in the middle: the top 8 are 40..47 by count.
    freq = {40 + i: 100 - i for i in range(10)} | {i: 1 for i in range(10)} | {20: 50}
    return _freq_file(tmp_path, freq), freq


def test_draft_index_plus_offset_maps_to_the_most_frequent_target_ids(tmp_path, skewed):
    path, freq = skewed
    result = _build(path, tmp_path, 8)
    d2t = np.load(result.d2t_path)
    target_ids = np.arange(8) + d2t
    top8 = sorted(freq, key=lambda t: (-freq[t], t))[:8]
    assert target_ids.tolist() == sorted(top8)
    assert target_ids.tolist() == list(range(40, 48))


def test_t2d_marks_exactly_the_target_ids_the_draft_holds(tmp_path, skewed):
    path, _ = skewed
    result = _build(path, tmp_path, 12)
    d2t, t2d = np.load(result.d2t_path), np.load(result.t2d_path)
    assert set(np.flatnonzero(t2d).tolist()) == set((np.arange(12) + d2t).tolist())
    assert int(t2d.sum()) == 12


def test_files_use_speculators_cache_names_dtypes_and_loader(tmp_path, skewed):
    from speculators.train.cli import _load_mappings  # the loader `speculators train` uses

    path, _ = skewed
    result = _build(path, tmp_path, 8)
    assert result.d2t_path == tmp_path / "v" / "d2t-8.npy"
    assert result.t2d_path == tmp_path / "v" / "t2d-8.npy"
    d2t, t2d, size = _load_mappings(result.d2t_path, result.t2d_path, 8)
    assert (d2t.dtype, tuple(d2t.shape)) == (torch.int64, (8,))
    assert (t2d.dtype, tuple(t2d.shape)) == (torch.bool, (TARGET_VOCAB,))
    assert size == 8


def test_coverage_is_share_of_loss_tokens_the_draft_vocab_holds(tmp_path, skewed):
    path, freq = skewed
    result = _build(path, tmp_path, 8)
    held = sum(freq[t] for t in range(40, 48))
    assert result.loss_tokens == sum(freq.values())
    assert result.covered_tokens == held
    assert result.coverage == pytest.approx(held / sum(freq.values()))
    assert result.distinct_tokens == len(freq)


def test_fewer_distinct_tokens_than_draft_fills_with_lowest_unused_ids(tmp_path):
    # speculators' builder keeps every seen token and pads with ids 0, 1, 2... not yet chosen.
    path = _freq_file(tmp_path, {7: 5, 30: 3, 2: 1})
    result = _build(path, tmp_path, 6)
    held = (np.arange(6) + np.load(result.d2t_path)).tolist()
    assert held == [0, 1, 2, 3, 7, 30]
    assert result.filler_tokens == 3
    assert result.coverage == 1.0


def test_draft_larger_than_target_vocab_is_refused(tmp_path, skewed):
    path, _ = skewed
    with pytest.raises(VocabError, match="larger than the target's vocabulary"):
        _build(path, tmp_path, 51)
    assert not (tmp_path / "v").exists()


def test_token_id_outside_target_vocab_is_refused(tmp_path):
    path = _freq_file(tmp_path, {3: 1, 60: 2})
    with pytest.raises(VocabError, match="token id 60 is outside"):
        _build(path, tmp_path, 4)


def test_missing_token_freq_file_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "token_freq.pt"
    with pytest.raises(VocabError, match=str(missing)):
        _build(missing, tmp_path, 4)


def test_counter_saved_like_speculators_combine_step_is_accepted(tmp_path):
    # combine_token_frequency_distributions saves dict(Counter): plain int keys and counts.
    path = _freq_file(tmp_path, dict(Counter({1: 4, 2: 2, 3: 1})))
    result = _build(path, tmp_path, 2)
    assert result.covered_tokens == 6


def test_progress_reports_start_and_finish(tmp_path, skewed):
    path, _ = skewed
    calls = []
    _build(path, tmp_path, 4, on_progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 1), (1, 1)]
