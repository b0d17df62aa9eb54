"""speculators' Trainer trained online: its own `--vllm-endpoint URL/v1 --on-missing generate` asks a
real vLLM capture server (the CPU build, `make vllm`) for every sample's hidden states; no extraction.

One capture server, started once for the module by the online loop's own CaptureFleet, serves the
tests (a start takes one to two minutes on two cores); the training reaches it by URL. speculators'
Trainer runs on the CPU through the test-only seam of tests/stages/train/with_speculators/test_train_speculators.py.
Where vLLM is not installed the tests that need it skip, saying so (CI sets EAGLE3WEB_REQUIRE_VLLM=1: they
fail there instead)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tests.stages.train.with_speculators.test_train_speculators import CPU_ARGS, CPU_SEAM_ENV, DRAFT_VOCAB
from tests.helpers.vllm_here import vllm_or_skip

from workers.contract.target import default_layer_ids
from workers.stages.train.online.staging import CaptureRefused
from workers.stages.train.online.source import OnlineSource
from workers.stages.train.with_speculators.online import endpoint_choice, parse_counters
from workers.stages.train.with_speculators.trainer import speculators_command, train_with_speculators

MAX_SEQ_LEN = 256
CHATS = 10
# Lines of vLLM 0.32's /metrics page (its CPU build, serving a capture server here), the counters the
# supply figures read among neighbours whose names start alike.
METRICS_PAGE = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="/data/target"} 2311.0
vllm:prompt_tokens_created{engine="0",model_name="/data/target"} 1.796433221745774e+09
vllm:prompt_tokens_by_source_total{engine="0",model_name="/data/target",source="local_compute"} 2311.0
vllm:prompt_tokens_cached_total{engine="0",model_name="/data/target"} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="/data/target"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="/data/target"} 14.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="/data/target"} 0.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="/data/target"} 0.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="/data/target"} 1.7964332217459216e+09
vllm:request_prompt_tokens_sum{engine="0",model_name="/data/target"} 2311.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{engine="0",model_name="/data/target"} 17.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="/data/target"} 2.5
"""


def test_counters_are_summed_over_their_labels():
    counters = parse_counters(METRICS_PAGE)
    assert (counters.requests, counters.prompt_tokens, counters.request_seconds) == (17.0, 2311.0, 2.5)
    assert parse_counters("").request_seconds is None  # a page without the histogram: no rate, not 0


def test_speculators_asks_one_endpoint_and_the_rest_are_named_as_unused(tmp_path):
    started = OnlineSource(cache_dir=tmp_path, cache_bytes=1, capture_servers=3, capture_urls=("http://h:1",))
    assert endpoint_choice(started) == (1, (), ["2 more capture servers (not started)", "http://h:1"])
    reached = OnlineSource(cache_dir=tmp_path, cache_bytes=1, capture_servers=0,
                           capture_urls=("http://a:1", "http://b:2"))
    assert endpoint_choice(reached) == (0, ("http://a:1",), ["http://b:2"])
    command = speculators_command(
        torchrun="torchrun", num_gpus=1, fsdp=False, target_dir=Path("/t"), data_dir=tmp_path, out_dir=tmp_path,
        aux_layer_ids=[2], draft_vocab_size=8, epochs=1, lr=1e-3, ttt_steps=1, seed=0, total_seq_len=64,
        train_data_ratio=0.5, online_flags=["--on-missing", "generate", "--vllm-endpoint", "http://a:1/v1"])
    flags = " ".join(command)
    assert "--on-missing generate --vllm-endpoint http://a:1/v1" in flags and "--on-missing raise" not in flags


@pytest.fixture(scope="module")
def run_dir(tiny_target, tmp_path_factory):
    """prepared/ and vocab/ of a run from the first chats: no extraction at all."""
    from workers.stages.prepare.stage import prepare
    from workers.stages.vocab import build_vocab

    root = tmp_path_factory.mktemp("spec-online")
    lines = tiny_target.chats_path.read_text().splitlines()[:CHATS]
    (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
    prepared = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=root / "chats.jsonl",
                       out_dir=root / "run" / "prepared", max_seq_len=MAX_SEQ_LEN)
    vocab = build_vocab(token_freq_path=prepared.token_freq_path, out_dir=root / "run" / "vocab",
                        draft_vocab_size=DRAFT_VOCAB, target_vocab_size=tiny_target.vocab_size)
    return {"run": root / "run", "target_dir": tiny_target.target_dir, "prepared_dir": prepared.out_dir,
            "d2t_path": vocab.d2t_path, "t2d_path": vocab.t2d_path,
            "layer_ids": default_layer_ids(tiny_target.num_layers)}


@pytest.fixture(scope="module")
def capture_server(tiny_target, run_dir, tmp_path_factory):
    """One `vllm serve` capture server for the run's layers, shared by the tests (stopped after them)."""
    from workers.stages.train.online.servers import CaptureFleet

    install = vllm_or_skip()
    with CaptureFleet(target_dir=tiny_target.target_dir, layer_ids=run_dir["layer_ids"], count=1, urls=(),
                      work_dir=tmp_path_factory.mktemp("capture"), max_model_len=MAX_SEQ_LEN + 1,
                      vllm_executable=install.executable) as fleet:
        yield fleet.servers[0]


def _train(run_dir, server, *, out_dir: Path, layer_ids=None, **kwargs):
    online = OnlineSource.from_gib(cache_dir=out_dir.parent / "hs_cache", cache_gib=0.5, capture_servers=0,
                                   capture_urls=(server.url,), capture_allowed_hosts=("127.0.0.1",),
                                   capture_staging_dir=server.staging.parent)
    return train_with_speculators(
        target_dir=run_dir["target_dir"], prepared_dir=run_dir["prepared_dir"], hidden_states_dir=None,
        d2t_path=run_dir["d2t_path"], t2d_path=run_dir["t2d_path"], out_dir=out_dir,
        layer_ids=layer_ids or run_dir["layer_ids"], epochs=1, lr=3e-3, ttt_steps=2, draft_vocab_size=DRAFT_VOCAB,
        val_fraction=0.25, max_tokens_per_step=MAX_SEQ_LEN, extra_args=CPU_ARGS, env=CPU_SEAM_ENV, online=online,
        **kwargs)


@pytest.fixture(scope="module")
def trained(run_dir, capture_server):
    points: list[dict] = []
    result = _train(run_dir, capture_server, out_dir=run_dir["run"] / "checkpoints", on_metrics=points.extend)
    return result, points


@pytest.mark.slow
def test_speculators_trains_online_through_its_own_endpoint_option_cpu_device_patched(trained, run_dir,
                                                                                       capture_server):
    from speculators.models.eagle3 import Eagle3DraftModel

    result, _points = trained
    [checkpoint] = result.checkpoints
    assert math.isfinite(checkpoint.train_loss) and math.isfinite(checkpoint.val_loss)
    config = json.loads((checkpoint.path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == DRAFT_VOCAB
    assert Eagle3DraftModel.from_pretrained(str(checkpoint.path)).d2t.shape == (DRAFT_VOCAB,)
    command = (result.out_dir / "train_command.txt").read_text()
    assert f"--vllm-endpoint {capture_server.url}/v1" in command and "--on-missing generate" in command
    # The folder speculators was given stays empty, and the server's folder holds no sample once each
    # was read: nothing accumulated beyond what was in flight.
    given = run_dir["run"] / "speculators_data_split" / "hidden_states"
    assert f"--data-path {given.parent}" in command
    assert given.is_dir() and list(given.iterdir()) == []
    assert [p.name for p in capture_server.staging.iterdir()] == []
    log = (result.out_dir / "speculators_train.log").read_text()
    assert "Hidden-state round trip failed" not in log  # no sample needed a second request


@pytest.mark.slow
def test_supply_counts_what_the_endpoint_served_cpu_device_patched(trained, run_dir, capture_server):
    from datasets import load_from_disk

    result, points = trained
    rows = load_from_disk(str(run_dir["prepared_dir"])).with_format(None)
    supply = result.supply
    assert supply["hidden_states"] == "online"
    # One epoch reads every train row once and validation every held-out row once, each asked of the server.
    assert result.split.train_rows + result.split.val_rows == len(rows)
    assert supply["served_by"] == {capture_server.url: len(rows)}
    assert supply["capture_tokens"] == sum(rows["seq_len"])
    assert supply["capture_tokens_per_s"] > 0 and supply["capture_seconds"] > 0
    assert 0 < supply["fetch_wait_fraction"] <= 1 and supply["fetch_wait_seconds"] > 0
    layers, width = len(run_dir["layer_ids"]), 128
    one_sample = max(rows["seq_len"]) * (layers * width * 2 + 8) + 4096  # bf16 states, int64 ids, header
    assert 0 <= supply["peak_cache_bytes"] <= one_sample  # one sample in flight at a time (--num-workers 0)
    assert "not measured from outside speculators' process" in supply["advice"]
    charted = [p for p in points if p["key"] == "supply/fetch_wait_fraction"]
    assert charted and all(0 < p["value"] <= 1 for p in charted)


@pytest.mark.slow
def test_a_server_capturing_other_layers_is_refused_before_the_trainer_starts(run_dir, capture_server, tmp_path):
    served = run_dir["layer_ids"]
    other = [served[0] - 1, *served[1:]]
    with pytest.raises(CaptureRefused, match=rf"sample \d+: capture server {capture_server.url} captures layers "
                                             rf"\[{', '.join(map(str, served))}\], the run trains on layers "
                                             rf"\[{', '.join(map(str, other))}\]"):
        # A torchrun that does not exist: had the check let the server through, the trainer's start fails instead.
        _train(run_dir, capture_server, out_dir=tmp_path / "checkpoints", layer_ids=other,
               torchrun_executable="/nonexistent/torchrun")
    assert [p.name for p in capture_server.staging.iterdir()] == []  # the refused sample was not kept
    assert not list((tmp_path / "checkpoints").glob("*/model.safetensors"))
