"""A launch refuses a chat file that cannot give a training row (runs.pipeline.launch.dataset_launch_check): an
empty file, blank lines only, no assistant reply, every context over max_seq_len; with counts, on the
`dataset` field, nothing stored. Through the API, as the form and the client launch."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from runs.pipeline.launch import dataset_launch_check
from runs.pipeline.launch.dataset_launch_check import dataset_head

from tests.api.runs.test_api_runs import body, counts

pytestmark = pytest.mark.django_db

REPLY = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
NO_REPLY = {"messages": [{"role": "user", "content": "hi"}]}
ASSISTANT_FIRST = {"conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"}]}


def refusal(api, roots, **over) -> str:
    before = counts()
    response = api("launcher").post("/api/v1/runs/", body(roots, **over))
    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == ["dataset"]
    assert counts() == before
    return response.json()["fields"]["dataset"]


def write_lines(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def with_word_tokenizer(target_dir) -> None:
    """A real tokenizer.json (tokenizers' WordLevel): one token per whitespace-separated word."""
    vocab = {"[UNK]": 0, "hi": 1, "hello": 2, "word": 3}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(target_dir / "tokenizer.json"))


def test_an_empty_file_is_refused_as_empty(api, roots):
    (roots / "chats.jsonl").write_bytes(b"")
    words = refusal(api, roots)
    assert f"{roots / 'chats.jsonl'} is empty (0 bytes)" in words


def test_a_file_of_blank_lines_is_refused_as_holding_no_conversation(api, roots):
    (roots / "chats.jsonl").write_text("\n  \n\n")
    assert "holds only blank lines" in refusal(api, roots)


def test_conversations_without_a_reply_are_counted(api, roots):
    write_lines(roots / "chats.jsonl", [NO_REPLY, NO_REPLY, ASSISTANT_FIRST])
    words = refusal(api, roots)
    assert "no usable conversation in its 3 conversations" in words
    assert "3 have no assistant turn after the first message" in words


def test_contexts_over_max_seq_len_are_counted_with_the_targets_tokenizer(api, roots):
    with_word_tokenizer(roots / "target")
    long_context = {"messages": [{"role": "user", "content": " ".join(["word"] * 40)},
                                 {"role": "assistant", "content": "hello"}]}
    write_lines(roots / "chats.jsonl", [long_context, long_context, NO_REPLY])
    words = refusal(api, roots, max_seq_len=32)
    assert "1 has no assistant turn after the first message" in words
    assert "2 have max_seq_len=32 tokens or more before every assistant reply" in words
    # The same file with room for the context launches.
    assert api("launcher").post("/api/v1/runs/", body(roots, max_seq_len=64)).status_code == 201


def test_one_usable_conversation_among_unusable_ones_launches(api, roots):
    write_lines(roots / "chats.jsonl", [NO_REPLY, ASSISTANT_FIRST, REPLY])
    assert api("launcher").post("/api/v1/runs/", body(roots)).status_code == 201


def test_a_malformed_line_is_refused_naming_its_line_and_column(api, roots):
    (roots / "chats.jsonl").write_text(json.dumps(REPLY) + "\n\n\n" + '{"messages": [\n')
    words = refusal(api, roots)
    assert "chats.jsonl, line 4, column 15: not valid JSON (Expecting value)" in words
    assert "line 2" not in words and "line 1" not in words


def test_a_large_file_is_read_only_to_the_bound_and_the_refusal_says_so(api, roots, monkeypatch):
    monkeypatch.setattr(dataset_launch_check, "HEAD_CONVERSATIONS", 50)
    write_lines(roots / "chats.jsonl", [NO_REPLY] * 50 + [REPLY] * 10)
    head = dataset_head(roots / "chats.jsonl")
    assert (len(head.conversations), head.whole_file) == (50, False)
    words = refusal(api, roots)
    assert "the first 50 conversations read at launch (the first" in words and "50 have no assistant" in words
