"""The regenerate stage with the transformers backend: replies against an independent greedy decoding,
the rows' shape and counts, our readers reading the output back, resume (torn line, a SIGKILLed
process), curation, max_samples, failures and the checks of a target. vLLM: tests/e2e/vllm/test_regenerate_vllm.py."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.regenerate_data import (
    TOO_LONG_TEXT,
    GreedyReference,
    demo_rows,
    read_jsonl,
    role_content,
    shaped_rows,
    source_id,
    talking_target,
    turns_of,
    write_jsonl,
)
from workers.contract.errors import StopRequested
from workers.stages.regenerate.base import RegenerateError, RegenerateSettings
from workers.stages.regenerate.stage import regenerate
from workers.stages.regenerate.target import regenerate_check_target

ROOT = Path(__file__).resolve().parents[3]
MAX_NEW = 48
GREEDY = RegenerateSettings(max_new_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    return talking_target(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def source_rows(talker):
    return shaped_rows() + demo_rows(talker.chats_path, 12)


@pytest.fixture(scope="module")
def source(source_rows, tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("regen-src") / "chats.jsonl", source_rows)


@pytest.fixture(scope="module")
def regenerated(talker, source, tmp_path_factory):
    out = tmp_path_factory.mktemp("regen-out") / "out.jsonl"
    return regenerate(target_dir=talker.target_dir, source_path=source, out_path=out, backend="transformers",
                      settings=GREEDY, device="cpu")


@pytest.fixture(scope="module")
def reference(talker):
    return GreedyReference(talker.target_dir)


def _run(talker, source, out, **kwargs):
    kwargs.setdefault("settings", GREEDY)
    return regenerate(target_dir=talker.target_dir, source_path=source, out_path=out, backend="transformers",
                      device="cpu", **kwargs)


def test_greedy_replies_equal_an_independent_argmax_decoding(regenerated, source_rows, reference):
    written = read_jsonl(regenerated.out_path)
    assert [r["id"] for r in written] == [source_id(r, i) for i, r in enumerate(source_rows)]
    for row, out in zip(source_rows, written):
        expected = reference.conversation(row, MAX_NEW)
        assert [role_content(t) for t in turns_of(out)] == expected["turns"], out["id"]
        assert out["regenerated"] == {"turns": sum(1 for role, _ in expected["turns"] if role == "user"),
                                      "cut_turns": expected["cut_turns"], "tokens": expected["tokens"]}
    # Replies that vary and end: a target that wrote one answer everywhere would pass the loop above.
    replies = [role_content(t)[1] for out in written for t in turns_of(out) if role_content(t)[0] == "assistant"]
    assert len(set(replies)) > len(replies) // 2
    assert regenerated.replies_cut < regenerated.turns_regenerated // 2


def test_every_assistant_turn_is_replaced_and_the_other_turns_kept(regenerated, source_rows):
    for row, out in zip(source_rows, read_jsonl(regenerated.out_path)):
        kept = [t for t in turns_of(row) if role_content(t)[0] != "assistant"]
        got = turns_of(out)
        assert [t for t in got if role_content(t)[0] != "assistant"] == kept  # as written: same keys and text
        # One reply right after each user turn, none anywhere else.
        after_user = [role_content(a)[0] == "user" for a, b in zip(got, got[1:]) if role_content(b)[0] == "assistant"]
        assert all(after_user) and len(after_user) == sum(role_content(t)[0] == "user" for t in got)
        assert role_content(got[-1])[0] == "assistant"
        assert not any("thinking" in t or "reasoning_content" in t for t in got)
    sg = {r["id"]: r for r in read_jsonl(regenerated.out_path)}["sg-runs"]
    assert [t["from"] for t in sg["conversations"]] == ["system", "human", "gpt", "human", "gpt"]
    assert all(set(t) == {"from", "value"} for t in sg["conversations"])


def test_rows_keep_their_format_other_keys_and_an_id(regenerated, source_rows):
    written = read_jsonl(regenerated.out_path)
    for i, (row, out) in enumerate(zip(source_rows, written)):
        assert ("messages" in out) == ("messages" in row) and ("conversations" in out) == ("conversations" in row)
        others = {k: v for k, v in row.items() if k not in ("id", "messages", "conversations")}
        assert {k: v for k, v in out.items() if k in others} == others
        assert set(out) == set(others) | {"id", "regenerated", "messages" if "messages" in row else "conversations"}
        assert out["id"] == source_id(row, i) and isinstance(out["id"], str)
    assert [r["id"] for r in written][5:7] == ["5", "7"]  # the row without an id, and the integer one


def test_counts_are_those_of_the_written_rows(regenerated, source_rows):
    written = read_jsonl(regenerated.out_path)
    users = sum(role_content(t)[0] == "user" for r in written for t in turns_of(r))
    assert regenerated.conversations == len(written) == len(source_rows)
    assert regenerated.turns_regenerated == users == sum(r["regenerated"]["turns"] for r in written)
    # Whether a reply of this talker reaches MAX_NEW depends on its training; cuts are forced and counted
    # in test_replies_cut_at_max_new_tokens_are_counted.
    assert regenerated.replies_cut == sum(len(r["regenerated"]["cut_turns"]) for r in written)
    assert regenerated.generated_tokens == sum(r["regenerated"]["tokens"] for r in written)
    assert (regenerated.failures, regenerated.resumed_from, regenerated.skipped_excluded) == (0, 0, 0)
    assert regenerated.backend == "transformers" and regenerated.backend_version
    assert regenerated.tokens_per_s == pytest.approx(regenerated.generated_tokens / regenerated.seconds)
    assert not Path(regenerated.out_path + ".partial").exists()


def test_our_chats_reader_and_prepare_read_the_output(regenerated, talker, tmp_path):
    from workers.contract.chats.jsonl import read_conversations
    from workers.stages.prepare.stage import prepare

    convs = list(read_conversations(Path(regenerated.out_path)))
    written = read_jsonl(regenerated.out_path)
    assert [c.source_id for c in convs] == [r["id"] for r in written]
    assert [[(m["role"], m["content"]) for m in c.messages] for c in convs] == \
        [[role_content(t) for t in turns_of(r)] for r in written]
    prepared = prepare(tokenizer_dir=talker.target_dir, dataset_path=Path(regenerated.out_path),
                       out_dir=tmp_path / "prepared", max_seq_len=2048)
    assert prepared.num_conversations == regenerated.conversations
    assert prepared.num_rows == regenerated.turns_regenerated  # one training row per reply
    assert prepared.num_without_assistant == prepared.num_turns_dropped == 0


def test_replies_cut_at_max_new_tokens_are_counted(talker, source_rows, reference, tmp_path):
    rows = source_rows[:4]
    result = _run(talker, write_jsonl(tmp_path / "src.jsonl", rows), tmp_path / "out.jsonl",
                  settings=RegenerateSettings(max_new_tokens=4))
    expected = [reference.conversation(r, 4) for r in rows]
    assert [r["regenerated"]["cut_turns"] for r in read_jsonl(result.out_path)] == [e["cut_turns"] for e in expected]
    assert result.replies_cut == sum(len(e["cut_turns"]) for e in expected) > 0
    assert result.generated_tokens == sum(e["tokens"] for e in expected) <= 4 * result.turns_regenerated


def test_a_stop_then_a_torn_line_resume_with_each_id_once(talker, source, regenerated, tmp_path):
    out = tmp_path / "out.jsonl"
    progress = []
    with pytest.raises(StopRequested):
        _run(talker, source, out, on_progress=lambda done, total: progress.append(done),
             should_stop=lambda: bool(progress) and progress[-1] >= 2)
    partial = Path(str(out) + ".partial")
    lines = partial.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) == 2 and not out.exists()
    third = Path(regenerated.out_path).read_text(encoding="utf-8").splitlines(keepends=True)[2]
    with open(partial, "a", encoding="utf-8") as fh:
        fh.write(third[: len(third) // 2])  # a kill in the middle of a write
    result = _run(talker, source, out)
    assert result.resumed_from == 2
    assert read_jsonl(out) == read_jsonl(regenerated.out_path)
    assert (result.conversations, result.turns_regenerated, result.replies_cut, result.generated_tokens) == (
        regenerated.conversations, regenerated.turns_regenerated, regenerated.replies_cut, regenerated.generated_tokens)


def test_a_killed_process_resumes_without_repeating_an_id(talker, tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", demo_rows(talker.chats_path, 30, start=20))
    whole = _run(talker, src, tmp_path / "whole.jsonl")
    out = tmp_path / "out.jsonl"
    partial = Path(str(out) + ".partial")
    code = ("from pathlib import Path; from workers.stages.regenerate.base import RegenerateSettings; "
            "from workers.stages.regenerate.stage import regenerate; "
            f"regenerate(target_dir=Path({str(talker.target_dir)!r}), source_path=Path({str(src)!r}), "
            f"out_path=Path({str(out)!r}), backend='transformers', device='cpu', "
            f"settings=RegenerateSettings(max_new_tokens={MAX_NEW}))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if partial.exists() and partial.read_bytes().count(b"\n") >= 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not out.exists() and 2 <= partial.read_bytes().count(b"\n") < whole.conversations
    result = _run(talker, src, out)
    ids = [r["id"] for r in read_jsonl(out)]
    assert len(ids) == len(set(ids)) == whole.conversations and result.resumed_from >= 2
    assert read_jsonl(out) == read_jsonl(whole.out_path)
    keys = ("conversations", "turns_regenerated", "replies_cut", "generated_tokens", "failures")
    assert {k: getattr(result, k) for k in keys} == {k: getattr(whole, k) for k in keys}


def test_excluded_ids_are_skipped(talker, source_rows, tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", source_rows[:7])
    result = _run(talker, src, tmp_path / "out.jsonl", excluded_ids=frozenset({"oa-sys", "5"}),
                  settings=RegenerateSettings(max_new_tokens=4))
    assert [r["id"] for r in read_jsonl(result.out_path)] == ["sg-runs", "oa-two-users", "sg-odd-✓", "oa-long", "7"]
    assert result.skipped_excluded == 2 and result.conversations == 5


def test_max_samples_takes_the_first_conversations_not_excluded(talker, source_rows, tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", source_rows)
    result = _run(talker, src, tmp_path / "out.jsonl", excluded_ids=frozenset({"sg-runs"}),
                  settings=RegenerateSettings(max_new_tokens=4, max_samples=3))
    assert [r["id"] for r in read_jsonl(result.out_path)] == ["oa-sys", "oa-two-users", "sg-odd-✓"]
    assert result.skipped_excluded == 1


def test_unanswerable_conversations_go_to_failures_and_are_not_retried(talker, tmp_path):
    rows = [{"id": "ok", "messages": [{"role": "user", "content": "33 - 65 = ?"}]},
            {"id": "no-user", "conversations": [{"from": "system", "value": "Be brief."},
                                                {"from": "gpt", "value": "Hello."}]},
            {"id": "too-long", "messages": [{"role": "user", "content": TOO_LONG_TEXT}]},
            {"id": "ok", "messages": [{"role": "user", "content": "A second row with the first one's id"}]}]
    src, out = write_jsonl(tmp_path / "src.jsonl", rows), tmp_path / "out.jsonl"
    result = _run(talker, src, out, settings=RegenerateSettings(max_new_tokens=8))
    assert [r["id"] for r in read_jsonl(out)] == ["ok"]
    assert result.failures == 3 and [f["id"] for f in result.failure_examples] == ["no-user", "too-long", "ok"]
    errors = [f["error"] for f in result.failure_examples]
    assert "no user turn" in errors[0] and "max_model_len of 2048" in errors[1] and "is line 1's too" in errors[2]
    assert [f["id"] for f in read_jsonl(result.failures_path)] == ["no-user", "too-long", "ok"]
    before = out.read_bytes()
    again = _run(talker, src, out, settings=RegenerateSettings(max_new_tokens=8))
    assert (again.failures, again.conversations, again.resumed_from, again.seconds) == (3, 1, 1, 0.0)
    assert out.read_bytes() == before and len(read_jsonl(again.failures_path)) == 3


def test_a_file_without_any_user_turn_is_refused(talker, tmp_path):
    rows = [{"id": "a", "messages": [{"role": "system", "content": "x"}, {"role": "assistant", "content": "y"}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "only a reply"}]}]
    out = tmp_path / "out.jsonl"
    with pytest.raises(RegenerateError, match="none of its 2 conversations has a user turn"):
        _run(talker, write_jsonl(tmp_path / "src.jsonl", rows), out)
    assert list(tmp_path.iterdir()) == [tmp_path / "src.jsonl"]  # refused before anything was written


def test_sampled_replies_depend_on_the_seed_not_the_order(talker, source_rows, tmp_path):
    rows = source_rows[:4] + source_rows[6:]  # not the row without an id: reversing moves its line, its name
    sampled = RegenerateSettings(max_new_tokens=16, temperature=1.0, seed=3)
    forward = _run(talker, write_jsonl(tmp_path / "a.jsonl", rows), tmp_path / "a-out.jsonl", settings=sampled)
    backward = _run(talker, write_jsonl(tmp_path / "b.jsonl", rows[::-1]), tmp_path / "b-out.jsonl", settings=sampled)
    other = _run(talker, write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "c-out.jsonl",
                 settings=RegenerateSettings(max_new_tokens=16, temperature=1.0, seed=4))
    by_id = {r["id"]: r for r in read_jsonl(backward.out_path)}
    assert read_jsonl(forward.out_path) == [by_id[r["id"]] for r in read_jsonl(forward.out_path)]
    assert read_jsonl(forward.out_path) != read_jsonl(other.out_path)


def test_check_target_names_what_is_missing(tiny_target, tmp_path):
    regenerate_check_target(tiny_target.target_dir)
    no_template = shutil.copytree(tiny_target.target_dir, tmp_path / "no-template")
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(RegenerateError, match="no chat template"):
        regenerate_check_target(no_template)
    (no_template / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    regenerate_check_target(no_template)
    no_tokenizer = shutil.copytree(tiny_target.target_dir, tmp_path / "no-tokenizer")
    os.remove(no_tokenizer / "tokenizer.json")
    with pytest.raises(RegenerateError, match="no tokenizer files"):
        regenerate_check_target(no_tokenizer)
    no_config = shutil.copytree(tiny_target.target_dir, tmp_path / "no-config")
    os.remove(no_config / "config.json")
    with pytest.raises(RegenerateError, match="config.json"):
        regenerate_check_target(no_config)


def test_the_stage_modules_import_no_torch():
    code = ("import sys; from workers.stages.regenerate import base, merge, stage, target; "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
