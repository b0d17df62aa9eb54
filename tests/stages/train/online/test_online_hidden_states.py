"""Online training: hidden states from real vLLM capture servers (its CPU build), a bounded cache.

Two capture servers are started once for the module (CaptureFleet, as the train stage starts them) and
handed to the trainings by URL; the last test kills one of them mid-run. The offline baseline reads the
transformers extraction of the same rows (tests/e2e/vllm/test_real_vllm.py proves vLLM's files equal to it
within bf16 rounding), so the online losses are compared within what one bf16 step of hidden-state
difference moves the loss, measured here by training offline on states nudged by one bf16 step.
"""
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bench.pipeline.online import FolderPeak  # the benchmark's own sampler of the cache folder
from tests.stages.train.test_train import write_training_inputs
from tests.helpers.vllm_here import vllm_or_skip
from workers.contract.target import default_layer_ids, read_target_config
from workers.stages.extract.with_transformers import extract
from workers.stages.train.loop import train
from workers.stages.train.online.source import OnlineSource
from workers.stages.train.online.cache import CacheFullError, SampleCache
from workers.stages.train.online.capture import FAILURES_BEFORE_DEAD, CaptureClient
from workers.stages.train.online.staging import CaptureRefused
from workers.stages.train.online.servers import CaptureFleet

NUM_ROWS = 24
DRAFT_VOCAB = 512


# -- the cache alone (no vLLM) ------------------------------------------------------------------------

def _file(tmp: Path, name: str, size: int) -> Path:
    path = tmp / name
    path.write_bytes(b"x" * size)
    return path


def test_cache_evicts_least_recently_used_and_never_a_pinned_row(tmp_path):
    cache = SampleCache(tmp_path / "cache", limit_bytes=300)
    for row in range(3):
        cache.put(row, _file(tmp_path, f"in{row}", 100), server="a", tokens=1)
    cache.touch(0)  # 1 is now the least recently used
    cache.pin(1)    # ...but pinned: 2 goes instead
    cache.put(3, _file(tmp_path, "in3", 100), server="b", tokens=1)
    assert sorted(p.name for p in (tmp_path / "cache").glob("hs_*")) == [
        "hs_0.safetensors", "hs_1.safetensors", "hs_3.safetensors"]
    assert (cache.bytes, cache.peak_bytes, cache.evictions) == (300, 300, 1)
    cache.pin(0), cache.pin(3)
    with pytest.raises(CacheFullError, match="raise hidden_states_cache_gib"):
        cache.put(4, _file(tmp_path, "in4", 100), server="b", tokens=1)
    assert not cache.has(4)


def test_cache_adopts_an_earlier_attempts_files_within_its_limit(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    for row in range(4):
        (folder / f"hs_{row}.safetensors").write_bytes(b"y" * 100)
        time.sleep(0.01)
    (folder / "hs_9.safetensors.part").write_bytes(b"half")
    cache = SampleCache(folder, limit_bytes=250)
    assert [cache.has(r) for r in range(4)] == [False, False, True, True]  # the oldest went first
    assert not (folder / "hs_9.safetensors.part").exists()


def test_the_advice_sizes_the_capture_servers_from_the_measured_rates():
    from workers.stages.train.online.samples import advise
    from workers.stages.train.online.source import SupplyReport

    # 1,000 tokens trained in 10 s of which 5 s waiting: 200 tokens/s of compute; 1 server captures 100 tokens/s.
    starved = SupplyReport(hidden_states="online", fetch_wait_fraction=0.5, fetch_wait_seconds=5.0,
                           capture_tokens_per_s=100.0, bound="supply")
    assert advise(starved, train_seconds=10.0, train_tokens=1000, servers=1) == (
        "2 capture servers feed 1 trainer at this size: the trainer consumes 200 tokens/s, a server captures "
        "100 tokens/s; the trainer waited 50% of its step time: add 1 capture server")
    # Two servers capture 500 tokens/s together: one would do.
    fed = SupplyReport(hidden_states="online", fetch_wait_fraction=0.02, fetch_wait_seconds=0.2,
                       capture_tokens_per_s=500.0, bound="compute")
    assert advise(fed, train_seconds=10.0, train_tokens=1960, servers=2).startswith(
        "1 capture server feeds 1 trainer at this size: the trainer consumes 200 tokens/s, a server captures 250")


def test_capture_servers_on_a_cuda_host_take_the_gpus_after_the_trainers_or_a_share_of_its_own_mocked_gpu(
        monkeypatch):
    """No GPU here: the device choice is checked on the command and environment it builds."""
    from workers.stages.train.online.servers import on_gpu

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("EAGLE3WEB_CAPTURE_GPU_MEMORY_UTILIZATION", raising=False)
    command = ["vllm", "serve", "/t"]
    assert on_gpu(command, {}, n=0, visible=4) == (command, {"CUDA_VISIBLE_DEVICES": "1"})
    assert on_gpu(command, {}, n=3, visible=4) == (command, {"CUDA_VISIBLE_DEVICES": "1"})  # round robin over 1..3
    assert on_gpu(command, {"A": "b"}, n=1, visible=2) == (command, {"A": "b", "CUDA_VISIBLE_DEVICES": "1"})
    assert on_gpu(command, {}, n=0, visible=1) == (command + ["--gpu-memory-utilization", "0.35"], {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")  # this worker's GPUs: the server gets 6, then 7
    assert [on_gpu(command, {}, n=i, visible=3)[1]["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["6", "7", "6"]


# -- real vLLM ----------------------------------------------------------------------------------------

def reached_by_url(fleet: CaptureFleet) -> dict:
    """What a worker passes for servers given by URL: the host rule's list (these run on loopback, which
    is listed, as an operator lists it) and the staging folder their files must lie in (the fleet's
    folder, holding each server's own: their shared_storage_path is under it)."""
    return {"capture_allowed_hosts": ("127.0.0.1",), "capture_staging_dir": fleet.work_dir.resolve()}


@pytest.fixture(scope="module")
def inputs(tiny_target, tmp_path_factory):
    return write_training_inputs(tiny_target.target_dir, tiny_target.chats_path, tmp_path_factory.mktemp("online-in"),
                                 num_rows=NUM_ROWS, draft_vocab_size=DRAFT_VOCAB)


@pytest.fixture(scope="module")
def offline(inputs, tmp_path_factory):
    """The extraction an offline run trains on: the transformers backend's files for the same rows."""
    return extract(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir,
                   out_dir=tmp_path_factory.mktemp("online-offline") / "extraction", layer_ids=inputs.layer_ids,
                   device="cpu")


@pytest.fixture(scope="module")
def servers(inputs, tmp_path_factory):
    """Two capture servers on this host for the module's tests, given to the trainings by URL."""
    install = vllm_or_skip()
    fleet = CaptureFleet(target_dir=inputs.target_dir, layer_ids=inputs.layer_ids, count=2, urls=(),
                         work_dir=tmp_path_factory.mktemp("capture"), max_model_len=512,
                         vllm_executable=install.executable, startup_timeout_s=900)
    with fleet:
        yield fleet


def _train(inputs, out: Path, **extra):
    return train(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir, d2t_path=inputs.d2t_path,
                 t2d_path=inputs.t2d_path, out_dir=out, layer_ids=inputs.layer_ids, epochs=2, lr=3e-4, ttt_steps=2,
                 draft_vocab_size=inputs.draft_vocab_size, seed=0, device="cpu", max_tokens_per_step=256, **extra)


def _losses(points: list[dict]) -> list[float]:
    return [p["value"] for p in points if p["key"] == "loss" and p["split"] == "train"]


def _nudged_copy(src: Path, dst: Path) -> Path:
    """The extraction's hidden states each moved by one bf16 step (away from zero), in a new folder."""
    dst.mkdir(parents=True)
    for path in src.glob("hs_*.safetensors"):
        data = load_file(str(path))
        hs = data["hidden_states"]
        bits = hs.view(torch.int16) + torch.where(hs != 0, 1, 0).to(torch.int16)
        save_file({"token_ids": data["token_ids"], "hidden_states": bits.view(torch.bfloat16)}, str(dst / path.name))
    return dst


def test_an_online_run_trains_like_the_offline_one_with_its_cache_under_the_limit(inputs, offline, servers,
                                                                                  tmp_path):
    whole = sum(p.stat().st_size for p in offline.hidden_states_dir.glob("hs_*.safetensors"))
    limit = int(whole * 0.4)
    offline_points, nudged_points, online_points = [], [], []
    baseline = _train(inputs, tmp_path / "offline", hidden_states_dir=offline.hidden_states_dir,
                      on_metrics=offline_points.extend)
    _train(inputs, tmp_path / "nudged", on_metrics=nudged_points.extend,
           hidden_states_dir=_nudged_copy(offline.hidden_states_dir, tmp_path / "nudged-hs"))
    cache_dir = tmp_path / "cache"
    sampler = FolderPeak(cache_dir)
    sampler.start()
    try:
        result = _train(inputs, tmp_path / "online", hidden_states_dir=None, on_metrics=online_points.extend,
                        online=OnlineSource(cache_dir=cache_dir, cache_bytes=limit, capture_servers=0,
                                            capture_urls=tuple(s.url for s in servers.servers),
                                            **reached_by_url(servers)))
    finally:
        sampler.done.set()
        sampler.join()

    assert result.checkpoints and all(c.path.is_dir() for c in result.checkpoints)
    assert 0 < sampler.peak <= limit, (sampler.peak, limit)
    supply = result.supply
    assert supply["hidden_states"] == "online" and supply["peak_cache_bytes"] <= limit
    assert supply["capture_tokens"] > 0 and supply["capture_tokens_per_s"] > 0
    assert len(supply["cache_hit_rate_per_epoch"]) >= 2
    assert all(n > 0 for n in supply["served_by"].values()) and len(supply["served_by"]) == 2, supply["served_by"]
    assert supply["bound"] in ("supply", "compute") and "capture server" in supply["advice"]
    assert {"supply/fetch_wait_fraction", "supply/cache_hit_rate"} <= {p["key"] for p in online_points}

    # Epoch 1's losses: online against offline, within what one bf16 step of every hidden state moves them.
    steps = len(_losses(offline_points)) // 2
    ref, nudged, got = (_losses(p)[:steps] for p in (offline_points, nudged_points, online_points))
    assert len(got) == steps > 3
    tolerance = max(abs(a - b) for a, b in zip(ref, nudged))
    assert tolerance > 0
    worst = max(abs(a - b) for a, b in zip(ref, got))
    print(f"epoch 1 losses: worst online-offline {worst:.5f}, one bf16 step {tolerance:.5f}; cache peak {sampler.peak:,} "
          f"of {limit:,} (whole extraction {whole:,}); served {supply['served_by']}; {supply['advice']}")
    assert worst <= tolerance, (worst, tolerance, ref, got)  # measured: 0.00008 against 0.00032
    assert baseline.supply["hidden_states"] == "offline"


def test_a_server_capturing_other_layers_is_refused_naming_the_sample_and_nothing_is_cached(inputs, servers,
                                                                                            tmp_path):
    other = default_layer_ids(8)[:-2] + [6, 8]  # four ids, like the servers', but not theirs
    assert other != inputs.layer_ids and len(other) == len(inputs.layer_ids)
    cache_dir = tmp_path / "cache"
    with pytest.raises(CaptureRefused, match=r"sample \d+: capture server .* captures layers "):
        train(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir, d2t_path=inputs.d2t_path,
              t2d_path=inputs.t2d_path, out_dir=tmp_path / "out", layer_ids=other, epochs=1, lr=3e-4, ttt_steps=2,
              draft_vocab_size=inputs.draft_vocab_size, seed=0, device="cpu", hidden_states_dir=None,
              online=OnlineSource(cache_dir=cache_dir, cache_bytes=2**30, capture_servers=0,
                                  capture_urls=(servers.servers[0].url,), **reached_by_url(servers)))
    assert not list(cache_dir.glob("hs_*.safetensors"))


def test_a_sample_the_cache_has_no_room_for_fails_naming_the_cache_and_leaves_the_server_in_use(inputs, servers,
                                                                                              tmp_path):
    """A CacheFullError is about the run's cache setting: not retried, not a server failure (it once marked a
    healthy server dead and said "no capture server could produce it")."""
    from datasets import load_from_disk

    ids = list(load_from_disk(str(inputs.prepared_dir))[0]["input_ids"])
    target = read_target_config(inputs.target_dir)
    small = SampleCache(tmp_path / "small", limit_bytes=4096)
    fleet = CaptureFleet(target_dir=inputs.target_dir, layer_ids=inputs.layer_ids, count=0,
                         urls=(servers.servers[0].url,), work_dir=tmp_path / "work", max_model_len=512,
                         allowed_hosts=("127.0.0.1",), url_staging=servers.work_dir.resolve())
    with fleet:
        client = CaptureClient(fleet, small, layer_ids=inputs.layer_ids, hidden_size=target.hidden_size,
                               num_hidden_layers=target.num_layers, request_timeout_s=300)
        try:
            for _ in range(FAILURES_BEFORE_DEAD):  # as many as once marked the server dead
                small.reserve(0, 1024)  # room for less than the sample, the rest of the cache taken
                with pytest.raises(CacheFullError, match="raise hidden_states_cache_gib"):
                    client.capture(0, ids)
                small.release(0)
            server = fleet.servers[0]
            assert (server.why_dead(), server.failures, client.retried) == (None, 0, 0)
            assert not list(small.dir.rglob("*.safetensors*"))
            assert not list(servers.servers[0].staging.glob("*.safetensors*"))  # the refused file was deleted
            client.cache = roomy = SampleCache(tmp_path / "roomy", limit_bytes=2**30)
            assert client.capture(0, ids).server == server.url  # the same server, still in use
            assert roomy.has(0) and server.captured == 1
        finally:
            client.close()


def test_a_capture_server_killed_mid_run_leaves_the_run_finishing_on_the_other(inputs, servers, tmp_path):
    """Runs last in this module: it kills the second server."""
    doomed = servers.servers[1]
    cache_dir = tmp_path / "cache"

    def kill_after_some_samples():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and len(list(cache_dir.glob("hs_*.safetensors"))) < 4:
            time.sleep(0.05)
        doomed.process.stop(grace_s=0.5)

    killer = threading.Thread(target=kill_after_some_samples, daemon=True)
    killer.start()
    result = _train(inputs, tmp_path / "out", hidden_states_dir=None,
                    online=OnlineSource(cache_dir=cache_dir, cache_bytes=2**30, capture_servers=0,
                                        capture_urls=tuple(s.url for s in servers.servers),
                                        **reached_by_url(servers)))
    killer.join(timeout=5)
    assert doomed.process.died() is not None
    served = result.supply["served_by"]
    assert served[servers.servers[0].url] > served.get(doomed.url, 0)
    # The kill caught requests in flight on the doomed server: each failed there once and was redone on the
    # other (a request that fails on both fails the run).
    assert result.supply["retried"] >= 1
    # Every row, training's and validation's, captured exactly once: the 1 GiB cache never evicts, so epoch 2
    # and validation read from it, and a failed request is not counted as a capture.
    assert sum(served.values()) == NUM_ROWS, served
    rows = json.loads((cache_dir / "served.json").read_text())["samples"]
    assert sorted(int(row) for row in rows) == list(range(NUM_ROWS))
    assert len(result.checkpoints) == 2
