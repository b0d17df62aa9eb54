"""The vLLM extraction backend's client and its faults, against a stand-in `vllm` executable on PATH.

Real vLLM (its CPU build, `make vllm`) extracts in tests/e2e/vllm/test_real_vllm.py: that is where the
files are proven equal to transformers'. The stand-in (tests/standins/vllm) stays for what real vLLM
cannot be made to do here on demand, in seconds: a server that exits at start or mid-run, one that is
never healthy, one that writes a file a token short, a stop while it starts, a SIGKILLed worker; and
for checking our command line (argparse refuses anything speculators' launch_vllm.py would not
build) without a minute-long start per test. It writes what vLLM's hidden-states connector writes,
with the real tiny target's hidden states. Names say standin_vllm.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from workers.stages.extract.with_transformers import extract
from workers.stages.extract.batch_plan import open_prepared
from workers.stages.extract.with_vllm import (
    LOG_NAME,
    STAGING_DIRNAME,
    ExtractionStopped,
    VllmOutputError,
    extract_with_vllm,
)
from workers.stages.prepare.stage import prepare
from workers.contract.target import default_layer_ids
from workers.contract.extraction.verify import verify_extraction
from workers.stages.extract.vllm_server import VllmServerError, serve_command

STANDINS = Path(__file__).resolve().parents[2] / "standins"
CONVERSATIONS = 6
STOP_AFTER = 3


def _standin_env() -> dict:
    # The stand-in's `#!/usr/bin/env python3` must find this venv's python (torch, transformers).
    return {"PATH": os.pathsep.join([str(STANDINS), str(Path(sys.executable).parent), os.environ["PATH"]])}


@pytest.fixture
def standin_vllm(monkeypatch):
    for key, value in _standin_env().items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def prepared(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("extract-vllm")
    lines = tiny_target.chats_path.read_text().splitlines()[:CONVERSATIONS]
    (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
    return prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=root / "chats.jsonl",
                   out_dir=root / "prepared", max_seq_len=128)


@pytest.fixture(scope="module")
def layer_ids(tiny_target):
    return default_layer_ids(tiny_target.num_layers)  # [2, 4, 5, 8]: 8 is the last layer, as launch_vllm appends


@pytest.fixture(scope="module")
def reference(tiny_target, prepared, layer_ids, tmp_path_factory):
    return extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir,
                   out_dir=tmp_path_factory.mktemp("hf") / "run", layer_ids=layer_ids, device="cpu")


@pytest.fixture(scope="module")
def vllm_run(tiny_target, prepared, layer_ids, tmp_path_factory):
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        for key, value in _standin_env().items():
            mp.setenv(key, value)
        result = extract_with_vllm(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir,
                                   out_dir=tmp_path_factory.mktemp("vllm") / "run", layer_ids=layer_ids,
                                   tensor_parallel_size=2, startup_timeout_s=300,
                                   on_progress=lambda done, total: calls.append((done, total)))
    return result, calls


def _extract(tiny_target, prepared, layer_ids, out_dir, **kwargs):
    return extract_with_vllm(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=out_dir,
                             layer_ids=layer_ids, startup_timeout_s=300, **kwargs)


def _server_args(log_path: Path) -> dict:
    line = next(x for x in log_path.read_text().splitlines() if "non-default args:" in x)
    return json.loads(line.split("non-default args:", 1)[1])


def _requests(log_path: Path) -> int:
    return sum('"POST /v1/completions' in x for x in log_path.read_text().splitlines())


def _processes_using(path: Path) -> list[int]:
    """The process groups of live stand-in servers whose command line names path (each one's names its
    staging directory): one per server, led by the guard the stage starts it under
    (workers/stages/children/child_guard.py), which is there from the moment the stage starts the server."""
    groups = set()
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        is_server = str(STANDINS / "vllm") in cmdline or (
            any(part.endswith("child_guard.py") for part in cmdline) and "serve" in cmdline)
        if proc.info["status"] != psutil.STATUS_ZOMBIE and is_server and any(str(path) in part for part in cmdline):
            try:
                groups.add(os.getpgid(proc.info["pid"]))
            except ProcessLookupError:
                continue
    return sorted(groups)


def _wait_until(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_standin_vllm_extraction_equals_the_transformers_extraction(vllm_run, reference, prepared, tiny_target):
    result, calls = vllm_run
    rows = prepared.num_rows
    assert (result.num_samples, result.num_samples_extracted, result.num_samples_reused) == (rows, rows, 0)
    assert result.total_tokens == reference.total_tokens and calls[-1] == (rows, rows)
    assert sorted(p.name for p in result.hidden_states_dir.iterdir()) == sorted(
        p.name for p in reference.hidden_states_dir.iterdir())
    for i in range(rows):
        got = load_file(result.hidden_states_dir / f"hs_{i}.safetensors")
        want = load_file(reference.hidden_states_dir / f"hs_{i}.safetensors")
        assert got["token_ids"].dtype == torch.int64 and torch.equal(got["token_ids"], want["token_ids"])
        assert got["hidden_states"].dtype == torch.bfloat16 and got["hidden_states"].shape == want["hidden_states"].shape
        # At most one bf16 rounding step apart (2**-7 relative): the same float32 forward, batched or alone.
        torch.testing.assert_close(got["hidden_states"].float(), want["hidden_states"].float(), rtol=2**-7, atol=1e-3)
    report = verify_extraction(result.out_dir, target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir,
                               full=True)
    assert report.passed, [c.message for c in report.failures]
    assert not (result.out_dir / STAGING_DIRNAME).exists()


def test_standin_vllm_manifest_makes_every_claim_the_transformers_manifest_makes(vllm_run, reference):
    result, _ = vllm_run
    got, want = json.loads(result.manifest_path.read_text()), json.loads(reference.manifest_path.read_text())
    assert set(want) <= set(got)
    same = ("layer_ids", "max_seq_len", "total_samples", "total_tokens", "data_format_version", "hidden_size",
            "num_layers_captured", "dtype", "layer_id_convention", "last_layer", "file_pattern", "prepared_path",
            "bytes_on_disk")
    assert {k: got[k] for k in same} == {k: want[k] for k in same}
    assert (got["tp_size"], got["extraction_backend"], got["device"]) == (2, "vllm", "vllm (tensor parallel 2)")


def test_standin_vllm_command_line_carries_tp_size_layer_ids_and_the_staging_dir(vllm_run, layer_ids, prepared):
    result, _ = vllm_run
    args = _server_args(result.out_dir / LOG_NAME)
    assert args["tensor_parallel_size"] == 2
    assert args["speculative_config"] == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                          "draft_model_config": {"hf_config": {
                                              "eagle_aux_hidden_state_layer_ids": layer_ids}}}
    assert args["kv_transfer_config"] == {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                          "kv_connector_extra_config": {
                                              "shared_storage_path": str((result.out_dir / STAGING_DIRNAME).resolve())}}
    assert (args["dtype"], args["host"]) == ("bfloat16", "127.0.0.1")
    assert args["max_model_len"] == max(open_prepared(prepared.out_dir)[1]) + 1  # the longest row and its 1 new token
    assert _requests(result.out_dir / LOG_NAME) == prepared.num_rows


def test_standin_vllm_refuses_an_unknown_flag_and_a_missing_model(tiny_target, tmp_path, layer_ids):
    command = serve_command(vllm_executable="vllm", target_dir=tiny_target.target_dir, layer_ids=layer_ids,
                            staging_dir=tmp_path, tensor_parallel_size=1, port=1, max_model_len=64, dtype="bfloat16")
    env = {**os.environ, **_standin_env()}
    unknown = subprocess.run([*command, "--no-such-flag", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unrecognized arguments: --no-such-flag 1" in unknown.stderr
    no_model = subprocess.run([c for c in command if c != str(tiny_target.target_dir)], env=env,
                              capture_output=True, text=True, timeout=60)
    assert no_model.returncode == 2 and "the following arguments are required: model_tag" in no_model.stderr


def test_standin_vllm_server_dying_at_start_fails_with_its_log_tail(standin_vllm, tiny_target, prepared, layer_ids,
                                                                    tmp_path):
    out = tmp_path / "run"
    with pytest.raises(VllmServerError) as caught:
        _extract(tiny_target, prepared, layer_ids, out, tensor_parallel_size=3)  # 4 heads do not split 3 ways
    message = str(caught.value)
    assert "exited with code 1" in message
    assert "Total number of attention heads (4) must be divisible by tensor parallel size (3)" in message
    assert not (out / "data_config.json").exists() and not _processes_using(out)


def test_standin_vllm_server_never_healthy_times_out(standin_vllm, monkeypatch, tiny_target, prepared, layer_ids,
                                                     tmp_path):
    monkeypatch.setenv("STANDIN_VLLM_LOAD_SECONDS", "600")  # its weights "load" for ten minutes
    out = tmp_path / "run"
    with pytest.raises(VllmServerError, match=r"vllm serve was not healthy within 3 s \(GET http://127\.0\.0\.1:\d+/health\)"):
        extract_with_vllm(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=out,
                          layer_ids=layer_ids, startup_timeout_s=3)
    assert not _processes_using(out)


def test_standin_vllm_server_dying_mid_run_fails_with_its_log_tail(standin_vllm, monkeypatch, tiny_target, prepared,
                                                                   layer_ids, tmp_path):
    monkeypatch.setenv("STANDIN_VLLM_CRASH_AFTER", "2")
    out = tmp_path / "run"
    with pytest.raises(VllmServerError, match=r"(?s)died during extraction: vllm serve exited with code 1.*"
                                              r"CUDA error: an illegal memory access"):
        _extract(tiny_target, prepared, layer_ids, out, concurrency=1)
    assert len(list((out / "hidden_states").iterdir())) == 2 and not (out / "data_config.json").exists()


def test_standin_vllm_server_does_not_outlive_a_killed_worker(tiny_target, prepared, layer_ids, tmp_path):
    out = tmp_path / "run"
    code = ("import sys; from workers.stages.extract.with_vllm import extract_with_vllm; "
            "extract_with_vllm(target_dir=sys.argv[1], prepared_dir=sys.argv[2], out_dir=sys.argv[3], "
            "layer_ids=[int(i) for i in sys.argv[4].split(',')], startup_timeout_s=600)")
    env = {**os.environ, **_standin_env(), "STANDIN_VLLM_LOAD_SECONDS": "600"}
    worker = subprocess.Popen([sys.executable, "-c", code, str(tiny_target.target_dir), str(prepared.out_dir),
                               str(out), ",".join(map(str, layer_ids))], env=env, cwd=Path(__file__).resolve().parents[3])
    try:
        assert _wait_until(lambda: _processes_using(out)), "the stand-in server never started"
        worker.kill()  # SIGKILL: the worker runs no cleanup at all
        worker.wait()
        assert _wait_until(lambda: not _processes_using(out), timeout_s=15), "vllm serve outlived its worker"
    finally:
        worker.kill()
        for group in _processes_using(out):
            os.killpg(group, 9)


def test_standin_vllm_should_stop_during_start_stops_the_server(standin_vllm, monkeypatch, tiny_target, prepared,
                                                                layer_ids, tmp_path):
    monkeypatch.setenv("STANDIN_VLLM_LOAD_SECONDS", "600")
    out = tmp_path / "run"
    asked = []

    def should_stop():
        asked.append(len(_processes_using(out)))  # the server is up while it is asked
        return len(asked) >= 2

    with pytest.raises(ExtractionStopped, match="0 of"):
        _extract(tiny_target, prepared, layer_ids, out, should_stop=should_stop)
    assert asked[0] == 1 and not _processes_using(out)


def test_standin_vllm_retry_after_a_stopped_run_skips_finished_samples(standin_vllm, tiny_target, prepared, layer_ids,
                                                                       vllm_run, tmp_path):
    out, seen = tmp_path / "run", []
    with pytest.raises(ExtractionStopped):
        _extract(tiny_target, prepared, layer_ids, out, concurrency=1,
                 on_progress=lambda done, total: seen.append(done), should_stop=lambda: bool(seen) and seen[-1] >= STOP_AFTER)
    assert not _processes_using(out)  # should_stop mid-generation took the server down too
    written = sorted(p.name for p in (out / "hidden_states").iterdir())
    assert len(written) >= STOP_AFTER and not (out / "data_config.json").exists()
    first_requests = _requests(out / LOG_NAME)

    result = _extract(tiny_target, prepared, layer_ids, out)
    rows = prepared.num_rows
    assert (result.num_samples_reused, result.num_samples_extracted) == (len(written), rows - len(written))
    assert _requests(out / LOG_NAME) == rows - len(written)  # the retry's own server log
    assert first_requests >= len(written)
    full, _ = vllm_run
    for i in range(rows):  # the stand-in is deterministic: a resumed run holds the same samples
        got, want = load_file(out / "hidden_states" / f"hs_{i}.safetensors"), load_file(full.hidden_states_dir / f"hs_{i}.safetensors")
        assert torch.equal(got["hidden_states"], want["hidden_states"]) and torch.equal(got["token_ids"], want["token_ids"])


def test_standin_vllm_file_short_of_a_token_is_refused_naming_the_sample(standin_vllm, monkeypatch, tiny_target,
                                                                         prepared, layer_ids, tmp_path):
    monkeypatch.setenv("STANDIN_VLLM_DROP_LAST_TOKEN", "1")
    out = tmp_path / "run"
    with pytest.raises(VllmOutputError) as caught:
        _extract(tiny_target, prepared, layer_ids, out, concurrency=1)
    assert re.search(r"hs_\d+\.safetensors \(vLLM wrote cmpl-[0-9a-f]+-0\.safetensors\): hidden_states are "
                     r"torch\.bfloat16 \[\d+, 4, \d+\], expected torch\.bfloat16", str(caught.value))
    assert list((out / "hidden_states").iterdir()) == [] and not (out / "data_config.json").exists()
    assert not _processes_using(out)


def test_resumed_vllm_extraction_with_every_sample_kept_starts_no_server(vllm_run, tiny_target, prepared, layer_ids,
                                                                        tmp_path):
    full, _ = vllm_run
    out = tmp_path / "copy"
    shutil.copytree(full.out_dir, out)
    result = _extract(tiny_target, prepared, layer_ids, out, vllm_executable=str(tmp_path / "no-vllm-here"))
    assert (result.num_samples_reused, result.num_samples_extracted, result.tokens_extracted) == (
        prepared.num_rows, 0, 0)
    assert json.loads(result.manifest_path.read_text())["samples_reused"] == prepared.num_rows


def test_missing_vllm_executable_says_to_install_it_or_use_transformers(tiny_target, prepared, layer_ids, tmp_path):
    with pytest.raises(VllmServerError, match=r"was not found: install vLLM on this worker \(`make vllm`, .* transformers backend"):
        _extract(tiny_target, prepared, layer_ids, tmp_path / "run", vllm_executable="vllm-not-installed-here")
