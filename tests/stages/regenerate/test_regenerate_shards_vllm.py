"""A regeneration with real vLLM (its CPU build) split into two shards merges into one worker's file,
byte for byte, with sampled replies: each request carries its row's seed (turn_seed), so what vLLM
batches it with (other conversations in flight, which differ between one worker and a shard) does not
change it. One `vllm serve` of the talker, started with the stage's own command line, serves one
worker's run and both shards (a vLLM start takes minutes here), of the session's tiny target (the
talker of the other vLLM tests takes minutes more to train; sampled replies differ without it); a prompt too long
for the target fails in its shard as in one worker's run. Skips without vLLM unless EAGLE3WEB_REQUIRE_VLLM=1."""
from __future__ import annotations

import filecmp
from dataclasses import asdict

import pytest

from tests.e2e.vllm.test_regenerate_vllm import serve_command
from tests.helpers.regenerate_data import TOO_LONG_TEXT, demo_rows, shaped_rows, write_jsonl
from tests.helpers.vllm_here import vllm_or_skip
from workers.stages.regenerate.base import RegenerateSettings
from workers.stages.regenerate.stage import regenerate, regenerate_count_rows
from workers.stages.regenerate.merge import regenerate_merge
from workers.stages.shards import shard_dir, spans_split

pytestmark = pytest.mark.slow


def test_two_vllm_shards_merge_into_one_workers_file(tiny_target, tmp_path):
    from workers.stages.extract.vllm_server import VllmServer

    install = vllm_or_skip()
    talker = tiny_target  # the session's target (2,048 positions, as the talker): sampled replies vary anyway
    too_long = {"id": "too-long", "messages": [{"role": "user", "content": TOO_LONG_TEXT}]}
    rows = shaped_rows() + demo_rows(talker.chats_path, 10)
    source = write_jsonl(tmp_path / "chats.jsonl", rows[:12] + [too_long] + rows[12:])
    settings = RegenerateSettings(max_new_tokens=16, temperature=1.0, seed=11)
    common = dict(target_dir=talker.target_dir, source_path=source, backend="vllm", settings=settings,
                  exclude_ids=frozenset({"sg-runs"}))
    command, env, port = serve_command(install, talker)
    with VllmServer(command=command, log_path=tmp_path / "serve.log", port=port, env=env) as server:
        server.wait_healthy(timeout_s=900, should_stop=None, on_stop=RuntimeError)
        one = regenerate(out_path=tmp_path / "one.jsonl", vllm_server_url=server.base_url, **common)
        spans = spans_split(regenerate_count_rows(source_path=source, settings=settings,
                                                  exclude_ids=frozenset({"sg-runs"})), 2)
        parts = [regenerate(out_path=shard_dir(tmp_path / "stage", i) / "out.jsonl", rows=span,
                            vllm_server_url=server.base_url, **common) for i, span in reversed(list(enumerate(spans)))]
    merged = regenerate_merge(parts=parts[::-1], out_path=tmp_path / "merged.jsonl")
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "merged.jsonl").read_bytes()
    assert filecmp.cmp(one.failures_path, merged.failures_path, shallow=False)
    timing = ("seconds", "tokens_per_s", "out_path", "failures_path")
    assert {k: v for k, v in asdict(merged).items() if k not in timing} == \
        {k: v for k, v in asdict(one).items() if k not in timing}
    assert (one.failures, one.skipped_excluded, one.conversations) == (1, 1, len(rows) - 1)
    assert [p.failures for p in parts[::-1]] == [0, 1]  # the too-long row fails in the shard that holds it
