"""A retried extraction keeps the samples an earlier attempt wrote whole and extracts only the rest.

The earlier attempt is stopped for real: its progress callback raises after k rows, as a lost
worker would stop (files are written one per row, temp file + rename, so what it leaves is whole
or absent). batch_tokens=1 puts one row in each forward, so an interrupted and an uninterrupted
extraction run the very same forwards and their files can be compared byte for byte.
"""
import json
import shutil

import pytest

from workers.stages.extract.with_transformers import extract
from workers.stages.extract.resume import RESUME_NAME, sample_is_whole
from workers.stages.prepare.stage import prepare
from workers.contract.target import default_layer_ids

CONVERSATIONS = 12
ROWS = 21  # the 12 conversations prepare into 21 rows (one per assistant turn)
STOP_AFTER = 5


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def prepared(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("extract-resume")
    lines = tiny_target.chats_path.read_text().splitlines()[:CONVERSATIONS]
    (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
    result = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=root / "chats.jsonl",
                     out_dir=root / "prepared", max_seq_len=128)
    assert result.num_rows == ROWS
    return result


@pytest.fixture(scope="module")
def layer_ids(tiny_target):
    return default_layer_ids(tiny_target.num_layers)


def run_extract(tiny_target, prepared, out_dir, layer_ids, *, stop_after=None, **kwargs):
    def on_progress(done, total):
        if stop_after is not None and done >= stop_after:
            raise Killed(f"killed after {done} of {total}")

    return extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=out_dir,
                   layer_ids=layer_ids, device="cpu", batch_tokens=1, on_progress=on_progress, **kwargs)


@pytest.fixture(scope="module")
def uninterrupted(tiny_target, prepared, layer_ids, tmp_path_factory):
    return run_extract(tiny_target, prepared, tmp_path_factory.mktemp("whole") / "out", layer_ids)


def files_of(hs_dir):
    return {p.name: p for p in sorted(hs_dir.iterdir())}


def interrupt(tiny_target, prepared, out_dir, layer_ids):
    with pytest.raises(Killed):
        run_extract(tiny_target, prepared, out_dir, layer_ids, stop_after=STOP_AFTER)
    written = files_of(out_dir / "hidden_states")
    assert len(written) == STOP_AFTER and not (out_dir / "data_config.json").exists()
    return written


def test_a_rerun_keeps_the_samples_written_whole_and_extracts_only_the_rest(tiny_target, prepared, layer_ids,
                                                                             uninterrupted, tmp_path):
    out = tmp_path / "out"
    written = interrupt(tiny_target, prepared, out, layer_ids)
    before = {name: (p.stat().st_mtime_ns, p.stat().st_ino, p.read_bytes()) for name, p in written.items()}
    result = run_extract(tiny_target, prepared, out, layer_ids)
    assert (result.num_samples_reused, result.num_samples_extracted) == (STOP_AFTER, ROWS - STOP_AFTER)
    assert result.num_samples == ROWS
    for name, (mtime, inode, data) in before.items():  # not rewritten: the same file, untouched
        path = out / "hidden_states" / name
        assert (path.stat().st_mtime_ns, path.stat().st_ino, path.read_bytes()) == (mtime, inode, data)
    # every file, reused or extracted now, is byte for byte what one uninterrupted attempt writes
    mine, theirs = files_of(result.hidden_states_dir), files_of(uninterrupted.hidden_states_dir)
    assert sorted(mine) == sorted(theirs) == sorted(f"hs_{i}.safetensors" for i in range(ROWS))
    assert all(mine[n].read_bytes() == theirs[n].read_bytes() for n in mine)
    # the totals cover every sample; the speed only what this attempt ran through the target
    assert (result.total_tokens, result.bytes_on_disk) == (uninterrupted.total_tokens, uninterrupted.bytes_on_disk)
    reused_tokens = sum(len(r) for r in _rows(prepared, sorted(int(n[3:-12]) for n in before)))
    assert result.tokens_extracted == uninterrupted.total_tokens - reused_tokens
    assert result.tokens_per_second == pytest.approx(result.tokens_extracted / result.forward_seconds)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["total_samples"] == ROWS and manifest["total_tokens"] == uninterrupted.total_tokens
    assert manifest["samples_reused"] == STOP_AFTER and manifest["tokens_extracted"] == result.tokens_extracted


def _rows(prepared, indices):
    from datasets import load_from_disk

    data = load_from_disk(str(prepared.out_dir)).with_format(None)
    return [data[i]["input_ids"] for i in indices]


def test_a_truncated_or_foreign_sample_and_a_stray_temp_file_are_redone(tiny_target, prepared, layer_ids,
                                                                         uninterrupted, tmp_path):
    out = tmp_path / "out"
    written = interrupt(tiny_target, prepared, out, layer_ids)
    names = sorted(written)
    truncated, swapped = written[names[0]], written[names[1]]
    truncated.write_bytes(truncated.read_bytes()[:-100])  # what a disk-full or a copy cut short leaves
    swapped.write_bytes(written[names[2]].read_bytes())  # whole, but another row's tokens
    stray = out / "hidden_states" / "hs_20.safetensors.tmp"
    stray.write_bytes(b"half a write")
    result = run_extract(tiny_target, prepared, out, layer_ids)
    assert (result.num_samples_reused, result.num_samples_extracted) == (STOP_AFTER - 2, ROWS - STOP_AFTER + 2)
    assert not stray.exists()
    for name in (truncated.name, swapped.name):
        assert (out / "hidden_states" / name).read_bytes() == (uninterrupted.hidden_states_dir / name).read_bytes()


def test_a_finished_extraction_run_again_reuses_everything_without_loading_the_model(
        tiny_target, prepared, layer_ids, tmp_path, monkeypatch):
    from workers.stages.extract import with_transformers as extract_module

    out = tmp_path / "out"
    first = run_extract(tiny_target, prepared, out, layer_ids)
    monkeypatch.setattr(extract_module, "load_target", lambda *a, **k: pytest.fail("model loaded"))
    again = run_extract(tiny_target, prepared, out, layer_ids)
    assert (again.num_samples_reused, again.num_samples_extracted, again.tokens_extracted) == (ROWS, 0, 0)
    assert again.total_tokens == first.total_tokens and again.tokens_per_second == 0.0
    assert json.loads(again.manifest_path.read_text())["total_samples"] == ROWS


def test_other_layers_or_rewritten_prepared_rows_start_over(tiny_target, prepared, layer_ids, tmp_path):
    out = tmp_path / "out"
    interrupt(tiny_target, prepared, out, layer_ids)
    other = run_extract(tiny_target, prepared, out, [2, 3, tiny_target.num_layers])
    assert other.num_samples_reused == 0 and other.num_samples_extracted == ROWS
    assert json.loads((out / RESUME_NAME).read_text())["layer_ids"] == [2, 3, tiny_target.num_layers]

    # prepare ran again (same rows, new files): nothing is trusted, every sample is extracted again
    out2 = tmp_path / "out2"
    interrupt(tiny_target, prepared, out2, layer_ids)
    copy = tmp_path / "prepared-again"
    shutil.copytree(prepared.out_dir, copy)
    again = extract(target_dir=tiny_target.target_dir, prepared_dir=copy, out_dir=out2, layer_ids=layer_ids,
                    device="cpu", batch_tokens=1)
    assert again.num_samples_reused == 0 and again.num_samples_extracted == ROWS


def test_an_unreadable_record_starts_over(tiny_target, prepared, layer_ids, tmp_path):
    out = tmp_path / "out"
    interrupt(tiny_target, prepared, out, layer_ids)
    (out / RESUME_NAME).write_text('{"format": 1, "lay')  # torn, though it is written by rename
    result = run_extract(tiny_target, prepared, out, layer_ids)
    assert (result.num_samples_reused, result.num_samples_extracted) == (0, ROWS)
    assert json.loads((out / RESUME_NAME).read_text())["layer_ids"] == layer_ids


def test_a_folder_of_someone_elses_files_is_still_refused(tiny_target, prepared, layer_ids, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        run_extract(tiny_target, prepared, tmp_path / "o", layer_ids)
    assert (tmp_path / "o" / "keep.txt").read_text() == "mine"


def test_whole_means_the_header_the_size_and_the_row_tokens(uninterrupted, prepared, layer_ids, tiny_target, tmp_path):
    path = uninterrupted.hidden_states_dir / "hs_3.safetensors"
    ids = _rows(prepared, [3])[0]
    shape = dict(num_layers=len(layer_ids), hidden_size=tiny_target.hidden_size)
    assert sample_is_whole(path, token_ids=ids, **shape)
    assert not sample_is_whole(path, token_ids=ids[:-1], **shape)
    assert not sample_is_whole(path, token_ids=ids, num_layers=len(layer_ids) + 1, hidden_size=tiny_target.hidden_size)
    padded = tmp_path / "padded.safetensors"
    padded.write_bytes(path.read_bytes() + b"\0")
    assert not sample_is_whole(padded, token_ids=ids, **shape)
    assert not sample_is_whole(tmp_path / "absent.safetensors", token_ids=ids, **shape)
