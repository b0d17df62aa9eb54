import pytest

from workers.stages.shards import MIN_ROWS_PER_SHARD, spans_split, shards_default


@pytest.mark.parametrize("total,shards", [(0, 1), (1, 1), (7, 2), (7, 3), (10, 4), (3, 8), (1000, 7)])
def test_spans_cover_every_row_once_in_order(total, shards):
    spans = spans_split(total, shards)
    rows = [row for span in spans for row in span]
    assert rows == list(range(total))
    sizes = [len(span) for span in spans]
    assert max(sizes) - min(sizes) <= 1
    assert all(size > 0 for size in sizes) or total == 0
    assert len(spans) == max(1, min(shards, total))


def test_spans_refuse_nonsense():
    with pytest.raises(ValueError, match="shards"):
        spans_split(10, 0)
    with pytest.raises(ValueError, match="total_rows"):
        spans_split(-1, 2)


def test_default_is_live_workers_at_most_one_per_64_rows():
    assert shards_default(total_rows=1000, live_workers=4) == 4
    assert shards_default(total_rows=2 * MIN_ROWS_PER_SHARD, live_workers=4) == 2
    assert shards_default(total_rows=MIN_ROWS_PER_SHARD - 1, live_workers=4) == 1
    assert shards_default(total_rows=10_000, live_workers=0) == 1
