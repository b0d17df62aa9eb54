"""The online hidden-states cache alone (no vLLM): several capture threads reserving room and putting
files at once, the cache folder measured from disk by the benchmark's own sampler (bench/pipeline/online.py's
FolderPeak, every 20 ms), never over the limit."""
import os
import threading
import time
from pathlib import Path

import pytest

from bench.pipeline.online import FolderPeak
from workers.stages.train.online.cache import CacheFullError, SampleCache

SAMPLE = 1_000_000  # bytes of one sample file: large enough that a copy takes a while
ROOM = 4  # samples the limit holds
THREADS = 4
ROWS_PER_THREAD = 60


def _other_filesystem(tmp_path: Path) -> Path | None:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and os.stat(shm).st_dev != os.stat(tmp_path).st_dev:
        return shm
    return None


def _capture_threads(cache: SampleCache, staging_for, *, rows_per_thread: int) -> list[BaseException]:
    """THREADS threads, each: reserve a row's room, write its file where a capture server would, put it."""
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def capture(n: int) -> None:
        try:
            start.wait()
            staging = staging_for(n)
            staging.mkdir(parents=True, exist_ok=True)
            for i in range(rows_per_thread):
                row = n * 1000 + i
                cache.reserve(row, SAMPLE)
                written = staging / f"{row}.safetensors"
                written.write_bytes(b"\0" * SAMPLE)
                cache.put(row, written, server=f"thread-{n}", tokens=1)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=capture, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.parametrize("staging", ["inside", "elsewhere"])
def test_concurrent_reserves_and_puts_keep_the_folder_on_disk_under_the_limit(tmp_path, staging):
    """'inside': the capture servers write into the cache folder (as the train stage starts them);
    'elsewhere': on another filesystem, so each put copies into the cache (a .part file first).
    When put gave back a row's reservation before counting its file, a reserve in between evicted too
    little: 'elsewhere' (the copy widens that gap) went over in 6 runs of 6 on that code, 'inside'
    (a rename wide) in 1 of 6; both stay under with the reservation turned into the file's bytes in one step."""
    folder = tmp_path / "cache"
    limit = ROOM * SAMPLE + SAMPLE // 2
    if staging == "inside":
        def staging_for(n):
            return folder / "servers" / f"capture_{n}"
    else:
        other = _other_filesystem(tmp_path)
        if other is None:
            pytest.skip("no second filesystem (/dev/shm) to put from")
        root = Path(other) / f"eagle3web-cache-test-{os.getpid()}"

        def staging_for(n):
            return root / f"capture_{n}"
    cache = SampleCache(folder, limit_bytes=limit)
    sampler = FolderPeak(folder)
    sampler.start()
    try:
        errors = _capture_threads(cache, staging_for, rows_per_thread=ROWS_PER_THREAD)
        time.sleep(0.1)  # a few samples of the final folder too
    finally:
        sampler.done.set()
        sampler.join()
    assert not errors, errors
    on_disk = sum(p.stat().st_size for p in folder.rglob("*.safetensors*"))
    assert on_disk == cache.bytes <= limit
    assert cache.evictions == THREADS * ROWS_PER_THREAD - ROOM
    assert SAMPLE <= sampler.peak <= limit, (sampler.peak, limit)
    assert sampler.peak <= cache.peak_bytes <= limit  # the cache's own figure bounds what the disk held


def test_a_put_larger_than_its_reservation_evicts_for_the_difference_or_refuses_keeping_the_reservation(tmp_path):
    cache = SampleCache(tmp_path / "cache", limit_bytes=1000)
    (tmp_path / "a").write_bytes(b"x" * 600)
    cache.put(0, tmp_path / "a", server="s", tokens=1)
    cache.reserve(1, 300)
    (tmp_path / "b").write_bytes(b"x" * 500)
    cache.put(1, tmp_path / "b", server="s", tokens=1)  # 200 more than reserved: row 0 is evicted for it
    assert (cache.has(0), cache.has(1), cache.bytes, cache.evictions) == (False, True, 500, 1)
    cache.pin(1)
    cache.reserve(2, 300)
    (tmp_path / "c").write_bytes(b"x" * 600)
    with pytest.raises(CacheFullError, match="raise hidden_states_cache_gib"):
        cache.put(2, tmp_path / "c", server="s", tokens=1)
    assert (tmp_path / "c").exists() and not cache.has(2)  # the caller deletes the file, then releases
    with pytest.raises(CacheFullError):  # the 300 bytes stay set aside until then
        cache.reserve(3, 201)
    cache.release(2)
    cache.reserve(3, 500)
