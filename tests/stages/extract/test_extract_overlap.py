"""The extract stage's overlapped path: files written on a bounded writer thread while the next
forwards run. On the CPU there is no side stream or pinned memory, but the writer, its bound and
its failures are the same code as on CUDA, where extract() overlaps by default (the side-stream
copies into pinned buffers run only where a GPU is, e.g. bench/gpu/gpu_check.py's extraction)."""
import json
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path

import pytest
import torch

from tests.stages.extract.test_extract import layer_ids, prepared  # noqa: F401  (fixtures: 10 demo chats)
from workers.contract.extraction.verify import verify_extraction
from workers.stages.extract.output import files as files_module
from workers.stages.extract.resume import sample_is_whole
from workers.stages.extract.output.files import WRITES_IN_FLIGHT
from workers.stages.extract.with_transformers import bare_forward, extract
from workers.stages.extract.batch_plan import open_prepared, plan_forward_batches
from workers.stages.extract.output.writer import BoundedWriter

BATCH_TOKENS = 256  # several batches of a few rows each, so the writer has a queue to keep
WRITE_SECONDS = 0.3  # the slow disk's time per batch
TIME_KEYS = {"model_load", "forward_loop", "forward", "copies", "writes", "write_wait", "drain"}




def run(tiny_target, prepared, layer_ids, out_dir: Path, batch_tokens: int = BATCH_TOKENS, **kwargs):
    return extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=out_dir,
                   layer_ids=layer_ids, device="cpu", batch_tokens=batch_tokens, **kwargs)


@pytest.fixture(scope="module")
def synchronous(tiny_target, prepared, layer_ids, tmp_path_factory):
    return run(tiny_target, prepared, layer_ids, tmp_path_factory.mktemp("sync") / "out", overlap=False)


@pytest.fixture(scope="module")
def overlapped(tiny_target, prepared, layer_ids, tmp_path_factory):
    return run(tiny_target, prepared, layer_ids, tmp_path_factory.mktemp("overlap") / "out", overlap=True)


def write_order(prepared, budget: int = BATCH_TOKENS) -> list[int]:
    """Row indices in the order the stage writes them (the forward plan's, batch by batch)."""
    _, lengths = open_prepared(prepared.out_dir)
    return [i for batch in plan_forward_batches(lengths, budget) for i in batch]


def test_overlapped_files_are_byte_identical_to_the_synchronous_path(synchronous, overlapped, prepared):
    assert len(plan_forward_batches(open_prepared(prepared.out_dir)[1], BATCH_TOKENS)) > WRITES_IN_FLIGHT
    names = sorted(p.name for p in synchronous.hidden_states_dir.iterdir())
    assert names == sorted(p.name for p in overlapped.hidden_states_dir.iterdir())
    assert len(names) == synchronous.num_samples == prepared.num_rows
    for name in names:
        assert (overlapped.hidden_states_dir / name).read_bytes() == (synchronous.hidden_states_dir / name).read_bytes()
    assert (overlapped.bytes_on_disk, overlapped.total_tokens) == (synchronous.bytes_on_disk, synchronous.total_tokens)


def test_time_split_names_where_the_time_went_and_tokens_per_second_uses_the_forward_loop(synchronous, overlapped):
    for result in (synchronous, overlapped):
        split = result.time_split_s
        assert set(split) == TIME_KEYS
        assert split["forward_loop"] == result.forward_seconds > 0 and split["model_load"] == result.model_load_seconds
        assert result.tokens_per_second == pytest.approx(result.tokens_extracted / result.forward_seconds)
        assert split["forward"] > 0 and split["writes"] > 0 and split["copies"] == 0.0  # the CPU copies nothing
        assert split["forward"] <= split["forward_loop"]
    # Synchronous: the loop writes the files itself, and that time is not forward time.
    assert synchronous.time_split_s["write_wait"] >= synchronous.time_split_s["writes"]
    assert set(json.loads(synchronous.manifest_path.read_text())["time_split_s"]) == TIME_KEYS


class DiskFull(OSError):
    pass


def test_a_writer_failure_stops_the_stage_and_leaves_no_file_the_checks_accept(
        tiny_target, prepared, layer_ids, tmp_path, monkeypatch):
    import safetensors.torch

    fail_at = 4  # the fifth file written: after whole batches, inside the writer thread
    save_file, attempts = safetensors.torch.save_file, []

    def failing_save(tensors, filename, metadata=None):
        attempts.append(Path(filename))
        if len(attempts) == fail_at + 1:
            Path(filename).write_bytes(b"half a header")  # a write cut short leaves a partial temp file
            raise DiskFull(28, "No space left on device (test)")
        return save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", failing_save)
    out = tmp_path / "out"
    with pytest.raises(DiskFull, match=r"No space left on device \(test\)"):
        run(tiny_target, prepared, layer_ids, out, overlap=True)

    order = write_order(prepared)
    hs_dir = out / "hidden_states"
    failed = order.index(int(attempts[fail_at].name.split("_")[1].split(".")[0]))
    for i in order[failed:]:
        assert not (hs_dir / f"hs_{i}.safetensors").exists(), f"hs_{i} written at or after the failure"
    rows = open_prepared(prepared.out_dir)[0]["input_ids"]
    for i in order[:failed]:  # what was written before the failure is whole, so a retry keeps it
        assert sample_is_whole(hs_dir / f"hs_{i}.safetensors", token_ids=rows[i], num_layers=len(layer_ids),
                               hidden_size=tiny_target.hidden_size)
    assert not (out / "data_config.json").exists()
    report = verify_extraction(out, target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir)
    assert not report.passed
    assert report.check("prepared_tokens").verdict == "fail"


def test_a_rerun_after_a_writer_failure_completes_the_same_files(tiny_target, prepared, layer_ids, synchronous,
                                                                 tmp_path, monkeypatch):
    real_write, calls = files_module._write_batch, []

    def failing_write(hs_dir, batch):  # the third batch fails; the two before it are written whole
        calls.append(batch.indices)
        if len(calls) == 3:
            raise DiskFull(28, "No space left on device (test)")
        return real_write(hs_dir, batch)

    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(files_module, "_write_batch", failing_write)
        with pytest.raises(DiskFull):
            run(tiny_target, prepared, layer_ids, out, overlap=True)
    again = run(tiny_target, prepared, layer_ids, out, overlap=True)
    assert again.num_samples_reused == len(calls[0]) + len(calls[1])
    assert again.num_samples == synchronous.num_samples
    for path in synchronous.hidden_states_dir.iterdir():
        assert (again.hidden_states_dir / path.name).read_bytes() == path.read_bytes()
    assert verify_extraction(out, target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir).passed


def test_a_slow_disk_holds_the_forwards_back_at_the_writers_bound(tiny_target, prepared, layer_ids, tmp_path,
                                                                  monkeypatch):
    real_write, real_submit = files_module._write_batch, BoundedWriter.submit
    lock, counts = threading.Lock(), {"handed": 0, "written": 0, "max_in_flight": 0}

    def slow_write(hs_dir, batch):
        time.sleep(WRITE_SECONDS)
        written = real_write(hs_dir, batch)
        with lock:
            counts["written"] += 1
        return written

    def counting_submit(self, fn, /, *args, **kwargs):
        future = real_submit(self, fn, *args, **kwargs)
        with lock:
            counts["handed"] += 1
            counts["max_in_flight"] = max(counts["max_in_flight"], counts["handed"] - counts["written"])
        return future

    monkeypatch.setattr(files_module, "_write_batch", slow_write)
    monkeypatch.setattr(BoundedWriter, "submit", counting_submit)
    # One row per batch: many more batches than the bound, each written slower than it is computed.
    result = run(tiny_target, prepared, layer_ids, tmp_path / "out", batch_tokens=1, overlap=True)
    assert counts["handed"] == counts["written"] == prepared.num_rows
    assert counts["max_in_flight"] == WRITES_IN_FLIGHT
    # The forwards waited for the disk, and that wait is not counted as forward time.
    split = result.time_split_s
    assert split["write_wait"] > WRITE_SECONDS
    assert result.forward_seconds + split["write_wait"] + split["drain"] <= (
        result.total_time_seconds - result.model_load_seconds)


def test_the_writer_raises_a_failed_jobs_error_at_the_next_hand_off_and_runs_nothing_after_it():
    gate, ran, released = threading.Event(), [], []

    def job(name):
        if name == "first":
            gate.wait(5)
            raise ValueError("hs_7.safetensors: cannot write")
        ran.append(name)

    with pytest.raises(ValueError, match="hs_7.safetensors: cannot write"):
        with BoundedWriter(depth=3) as writer:
            first = writer.submit(job, "first")
            queued = writer.submit(job, "queued")
            queued.add_done_callback(released.append)  # e.g. a pinned buffer handed back
            gate.set()
            with pytest.raises(ValueError, match="hs_7.safetensors: cannot write") as raised:
                first.result(timeout=5)
            assert raised.value is first.exception()
            writer.submit(job, "later")
    assert ran == [] and released == [queued]
    with pytest.raises(CancelledError):
        queued.result()


def test_bare_forward_runs_the_stages_forwards_without_capturing(tiny_target, prepared, layer_ids, tmp_path,
                                                                 monkeypatch):
    from workers.stages.extract import with_transformers as extract_module

    real_load, inputs, hooked = extract_module.load_target, {"bare": [], "stage": []}, {}

    def recording_load(which):
        def load(*args, **kwargs):  # the base model's inputs, batch by batch: composition and padding
            model = real_load(*args, **kwargs)
            model.model.register_forward_pre_hook(
                lambda module, args, kw: inputs[which].append(kw["input_ids"].clone()), with_kwargs=True)
            hooked[which] = model
            return model
        return load

    monkeypatch.setattr(extract_module, "load_target", recording_load("bare"))
    bare = bare_forward(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, layer_ids=layer_ids,
                        device="cpu", batch_tokens=BATCH_TOKENS)
    monkeypatch.setattr(extract_module, "load_target", recording_load("stage"))
    run(tiny_target, prepared, layer_ids, tmp_path / "out", overlap=True)

    _, lengths = open_prepared(prepared.out_dir)
    assert bare["tokens"] == sum(lengths) and bare["seconds"] > 0
    assert bare["tokens_per_s"] == pytest.approx(bare["tokens"] / bare["seconds"])
    assert bare["batches"] == len(inputs["bare"]) == len(plan_forward_batches(lengths, BATCH_TOKENS))
    assert len(inputs["bare"]) == len(inputs["stage"])
    assert all(torch.equal(a, b) for a, b in zip(inputs["bare"], inputs["stage"]))
    layers = hooked["bare"].model.layers
    assert not any(m._forward_pre_hooks for m in [*layers, hooked["bare"].model.norm])  # nothing captured
