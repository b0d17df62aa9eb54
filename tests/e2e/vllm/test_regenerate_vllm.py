"""The regenerate stage with real vLLM (its CPU build, `make vllm`): greedy replies equal the transformers
backend's, cut replies and too-long prompts counted alike, seeded sampling reproducible whatever the
order, and a vLLM killed mid-way raising with its log while a rerun resumes.

Where vLLM is not installed these tests skip, saying so; with EAGLE3WEB_REQUIRE_VLLM=1 a missing vLLM
fails them. A vLLM start takes one to two minutes on two cores: one server, started here with the
stage's own command line, serves the module's tests (`vllm_server_url`); the kill test starts its own
through regenerate() and resumes on the shared one."""
from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from tests.helpers.vllm_here import vllm_or_skip
from tests.helpers.regenerate_data import TOO_LONG_TEXT, demo_rows, read_jsonl, shaped_rows, talking_target, write_jsonl
from workers.stages.regenerate.base import RegenerateError, RegenerateSettings
from workers.stages.regenerate.stage import regenerate

pytestmark = pytest.mark.slow

MAX_NEW = 48
MAX_MODEL_LEN = 2048  # the talker's positions: what regenerate() starts vLLM with for it


@pytest.fixture(scope="module")
def vllm_install():
    return vllm_or_skip()


@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    return talking_target(tmp_path_factory.getbasetemp())


def serve_command(vllm_install, talker) -> tuple[list[str], dict, int]:
    """(command, environment, port) of `vllm serve` of the talker as regenerate() starts it."""
    from workers.contract.target import read_target_json
    from workers.contract.host.vllm_env import kvcache_gib, server_environment
    from workers.stages.extract.vllm_server import free_port
    from workers.stages.regenerate.with_vllm import DEFAULT_CONCURRENCY, regenerate_serve_command

    port = free_port()
    command = regenerate_serve_command(vllm_executable=vllm_install.executable, target_dir=talker.target_dir,
                                       dtype="float32", max_model_len=MAX_MODEL_LEN, tensor_parallel_size=1,
                                       port=port, seed=0)
    env = server_environment(vllm_install, kvcache_space_gib=kvcache_gib(
        target_config=read_target_json(talker.target_dir), max_model_len=MAX_MODEL_LEN, concurrency=DEFAULT_CONCURRENCY))
    return command, env, port


@pytest.fixture(scope="module")
def server(vllm_install, talker, tmp_path_factory):
    """`vllm serve` of the talker as regenerate() starts it (same command line and environment)."""
    from workers.stages.extract.vllm_server import VllmServer

    command, env, port = serve_command(vllm_install, talker)
    with VllmServer(command=command, log_path=tmp_path_factory.mktemp("vllm") / "serve.log", port=port,
                    env=env) as running:
        running.wait_healthy(timeout_s=900, should_stop=None, on_stop=RuntimeError)
        yield running


@pytest.fixture(scope="module")
def source_rows(talker):
    return shaped_rows() + demo_rows(talker.chats_path, 16)


TOO_LONG_ROWS = (0, {"id": "too-long", "messages": [{"role": "user", "content": TOO_LONG_TEXT}]}, 1)
SETTINGS = {"greedy": RegenerateSettings(max_new_tokens=MAX_NEW), "cut": RegenerateSettings(max_new_tokens=4),
            "too_long": RegenerateSettings(max_new_tokens=8)}


def _rows(name: str, source_rows: list[dict]) -> list[dict]:
    if name == "too_long":
        return [source_rows[r] if isinstance(r, int) else r for r in TOO_LONG_ROWS]
    return source_rows


@pytest.fixture(scope="module")
def hf(vllm_install, talker, source_rows, tmp_path_factory):
    """The transformers backend's results for each case, made before the server starts: vLLM's CPU
    engine keeps its cores busy while it runs, which slows transformers on a small host many times."""
    results = {}
    for name, settings in SETTINGS.items():
        folder = tmp_path_factory.mktemp(f"hf-{name}")
        results[name] = regenerate(target_dir=talker.target_dir, source_path=write_jsonl(
            folder / "src.jsonl", _rows(name, source_rows)), out_path=folder / "hf.jsonl", backend="transformers",
            settings=settings, device="cpu")
    return results


def _vllm(name: str, talker, server, source_rows, tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", _rows(name, source_rows))
    return regenerate(target_dir=talker.target_dir, source_path=src, out_path=tmp_path / "vllm.jsonl",
                      backend="vllm", settings=SETTINGS[name], vllm_server_url=server.base_url)


COUNTS = ("conversations", "turns_regenerated", "replies_cut", "generated_tokens", "failures")


def test_greedy_replies_equal_the_transformers_backends(talker, hf, server, source_rows, vllm_install, tmp_path):
    vllm, hf_run = _vllm("greedy", talker, server, source_rows, tmp_path), hf["greedy"]
    assert read_jsonl(vllm.out_path) == read_jsonl(hf_run.out_path)
    assert {k: getattr(vllm, k) for k in COUNTS} == {k: getattr(hf_run, k) for k in COUNTS}
    assert vllm.turns_regenerated > len(source_rows) and vllm.replies_cut < vllm.turns_regenerated // 2
    # The server's /version leaves out the build suffix ("0.32.0" for "0.32.0+cpu").
    assert vllm.backend_version == vllm_install.version.split("+")[0]


def test_replies_cut_at_max_new_tokens_are_counted_alike(talker, hf, server, source_rows, tmp_path):
    vllm, hf_run = _vllm("cut", talker, server, source_rows, tmp_path), hf["cut"]
    assert [r["regenerated"] for r in read_jsonl(vllm.out_path)] == [r["regenerated"] for r in read_jsonl(hf_run.out_path)]
    assert vllm.replies_cut == hf_run.replies_cut > 0


def test_a_prompt_longer_than_max_model_len_fails_that_conversation_only(talker, hf, server, source_rows, tmp_path):
    vllm, hf_run = _vllm("too_long", talker, server, source_rows, tmp_path), hf["too_long"]
    assert [r["id"] for r in read_jsonl(vllm.out_path)] == ["oa-sys", "sg-runs"]
    assert [f["id"] for f in vllm.failure_examples] == [f["id"] for f in hf_run.failure_examples] == ["too-long"]
    assert "HTTP 400" in vllm.failure_examples[0]["error"]


def test_seeded_sampling_is_the_same_in_any_order(talker, server, source_rows, tmp_path):
    sampled = RegenerateSettings(max_new_tokens=16, temperature=1.0, seed=5)
    keyed = [r for r in source_rows if "id" in r]  # a row without one is named by its line, which reversing moves
    runs = []
    for name, rows, seed in (("a", keyed, 5), ("b", keyed[::-1], 5), ("c", keyed, 6)):
        runs.append(read_jsonl(regenerate(
            target_dir=talker.target_dir, source_path=write_jsonl(tmp_path / f"{name}.jsonl", rows),
            out_path=tmp_path / f"{name}-out.jsonl", backend="vllm", settings=replace(sampled, seed=seed),
            vllm_server_url=server.base_url).out_path))
    forward, backward, other_seed = runs
    assert sorted(forward, key=lambda r: r["id"]) == sorted(backward, key=lambda r: r["id"])
    assert sum(a != b for a, b in zip(forward, other_seed)) > len(forward) // 2  # the seed decides the samples


def test_a_killed_vllm_raises_with_its_log_and_a_rerun_resumes(talker, server, tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", demo_rows(talker.chats_path, 60, start=100))
    settings = RegenerateSettings(max_new_tokens=MAX_NEW)
    whole = regenerate(target_dir=talker.target_dir, source_path=src, out_path=tmp_path / "whole.jsonl",
                       backend="vllm", settings=settings, vllm_server_url=server.base_url)
    killed = []

    def kill_after_two(done: int, total: int) -> None:
        if done >= 2 and not killed:
            ours = [p for p in psutil.Process().children() if p.pid != server.proc.pid and "serve" in p.cmdline()]
            assert len(ours) == 1, ours
            os.killpg(ours[0].pid, signal.SIGKILL)  # its own process group: the engine core goes too
            killed.append(ours[0].pid)

    out = tmp_path / "out.jsonl"
    with pytest.raises(RegenerateError, match="vllm serve died mid-way") as error:
        regenerate(target_dir=talker.target_dir, source_path=src, out_path=out, backend="vllm", settings=settings,
                   work_dir=tmp_path / "work", on_progress=kill_after_two)
    assert killed and "exited with code" in str(error.value) and str(tmp_path / "work") in str(error.value)
    written = len(read_jsonl(Path(str(out) + ".partial")))
    assert 2 <= written < whole.conversations and not out.exists()
    result = regenerate(target_dir=talker.target_dir, source_path=src, out_path=out, backend="vllm", settings=settings,
                        vllm_server_url=server.base_url)
    assert result.resumed_from == written
    ids = [r["id"] for r in read_jsonl(out)]
    assert len(ids) == len(set(ids)) and read_jsonl(out) == read_jsonl(whole.out_path)
    assert {k: getattr(result, k) for k in COUNTS} == {k: getattr(whole, k) for k in COUNTS}


START_AND_WAIT = """
import json, sys
from pathlib import Path
from workers.stages.extract.vllm_server import VllmServer
args = json.loads(sys.argv[1])
server = VllmServer(command=args["command"], log_path=Path(args["log"]), port=args["port"], env=args["env"])
server.start()
server.wait_healthy(timeout_s=900, should_stop=None, on_stop=RuntimeError)
print(server.proc.pid, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_worker_killed_while_vllm_serves_leaves_no_vllm_process_after_10_s(vllm_install, talker, tmp_path):
    """A stand-in for the worker (a process that starts `vllm serve` as the stage does) is SIGKILLed once
    the server answers; 10 s later nothing of the server's process group is left, engine core included."""
    import json
    import subprocess
    import sys
    import time

    from workers.stages.children.child_guard import _group_alive

    command, env, port = serve_command(vllm_install, talker)
    worker = subprocess.Popen(
        [sys.executable, "-c", START_AND_WAIT, json.dumps({"command": command, "log": str(tmp_path / "serve.log"),
                                                           "port": port, "env": env})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    group = int(worker.stdout.readline())  # the server answers /health
    assert len(_members(group)) >= 3, _members(group)  # the guard, vllm serve and its engine core
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 10
    while _group_alive(group, -1) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _members(group) if _group_alive(group, -1) else []
    if left:
        os.killpg(group, signal.SIGKILL)
    assert left == []


def _members(group: int) -> list[str]:
    """The names of the group's processes that are not zombies."""
    names = []
    for p in psutil.process_iter(["pid", "name", "status"]):
        try:
            if os.getpgid(p.info["pid"]) == group and p.info["status"] != psutil.STATUS_ZOMBIE:
                names.append(p.info["name"])
        except (ProcessLookupError, PermissionError):
            continue
    return names
