"""The prepare stage: chat JSONL -> speculators 0.9 prepared dataset and token_freq.pt."""
import json
import shutil
from collections import Counter

import pytest
import torch

from tests.helpers.long_chats import long_chat_rows
from workers.contract.chats.jsonl import DatasetFormatError
from workers.stages.prepare.stage import prepare

SUBSET = 24  # conversations; enough for multi-turn rows, fast on 2 cores


@pytest.fixture(scope="module")
def chats(tiny_target, tmp_path_factory):
    lines = tiny_target.chats_path.read_text().splitlines()[:SUBSET]
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def prepared(tiny_target, chats, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep") / "prepared"
    return prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=chats, out_dir=out, max_seq_len=256)


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_target.target_dir), local_files_only=True)


def _messages(row: dict) -> list[dict]:
    if "messages" in row:
        return row["messages"]
    names = {"human": "user", "gpt": "assistant", "system": "system"}
    return [{"role": names[t["from"]], "content": t["value"]} for t in row["conversations"]]


def _rows(path):
    from datasets import load_from_disk

    return load_from_disk(str(path))


def _write(tmp_path, rows: list) -> object:
    path = tmp_path / "in.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_writes_dataset_that_speculators_arrow_reader_loads(prepared):
    from speculators.train.data import ArrowDataset

    ds = _rows(prepared.out_dir)
    assert {"input_ids", "loss_mask", "seq_len"} <= set(ds.column_names)
    assert ds.format["type"] == "torch"  # speculators compares token ids with torch.equal
    row = ds[0]
    assert row["input_ids"].dtype == torch.int64 and row["loss_mask"].dtype == torch.int64
    reader = ArrowDataset(max_len=256, datapath=prepared.out_dir, on_missing="skip")
    assert reader.approx_lengths == [len(r) for r in ds.with_format(None)["input_ids"]]
    assert len(reader) == prepared.num_rows


def test_each_assistant_turn_after_the_first_message_becomes_its_own_row(prepared, chats):
    convs = [_messages(json.loads(line)) for line in chats.read_text().splitlines()]
    turns = sum(1 for m in convs for j, t in enumerate(m) if t["role"] == "assistant" and j > 0)
    ds = _rows(prepared.out_dir).with_format(None)
    assert prepared.num_rows == len(ds) == turns
    assert prepared.num_conversations == SUBSET
    # A conversation's rows grow turn by turn, each the previous one plus one exchange.
    first_id = ds[0]["source_id"]
    own = [r["input_ids"] for r in ds if r["source_id"] == first_id]
    assert all(b[: len(a)] == a for a, b in zip(own, own[1:]))


def test_loss_mask_is_one_exactly_on_the_rows_last_reply_its_end_token_and_the_newline_after_it(
    prepared, chats, tokenizer
):
    ds = _rows(prepared.out_dir).with_format(None)
    convs = {json.loads(line)["id"]: _messages(json.loads(line)) for line in chats.read_text().splitlines()}
    seen = Counter()
    for row in ds:
        msgs = convs[row["source_id"]]
        replies = [t["content"] for j, t in enumerate(msgs) if t["role"] == "assistant" and j > 0]
        reply = replies[seen[row["source_id"]]]
        seen[row["source_id"]] += 1
        masked = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
        # speculators' prepare-data supervises everything after the generation prompt, the
        # template's newline after the end token included, although this template's
        # {% generation %} block stops at the end token.
        assert tokenizer.decode(masked) == reply + tokenizer.eos_token + "\n"
        assert row["loss_mask"][-len(masked):] == [1] * len(masked)  # one span, ending the row
    assert prepared.mask_source == "render_boundary"


def test_template_without_generation_tags_gives_the_same_rows(
    tiny_target, chats, prepared, tmp_path, tokenizer
):
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_target.target_dir / name, tok_dir / name)
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    plain = cfg["chat_template"].replace("{% generation %}", "").replace("{% endgeneration %}", "")
    assert "generation" not in plain.replace("add_generation_prompt", "")
    cfg["chat_template"] = plain
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    result = prepare(tokenizer_dir=tok_dir, dataset_path=chats, out_dir=tmp_path / "out", max_seq_len=256)
    assert result.mask_source == "render_boundary"
    row = _rows(result.out_dir).with_format(None)[0]
    masked = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
    reply = _messages(json.loads(chats.read_text().splitlines()[0]))[1]["content"]
    # speculators' boundary rule supervises everything after the generation prompt: the reply,
    # its end token and the template's trailing newline.
    assert tokenizer.decode(masked) == reply + tokenizer.eos_token + "\n"
    assert row["loss_mask"][-len(masked):] == [1] * len(masked)
    # The tags change nothing: the mask comes from the render boundary either way.
    tagged = _rows(prepared.out_dir).with_format(None)
    plain_rows = _rows(result.out_dir).with_format(None)
    assert plain_rows["input_ids"] == tagged["input_ids"] and plain_rows["loss_mask"] == tagged["loss_mask"]


def test_token_freq_matches_what_speculators_counts_on_the_same_rows(prepared, tmp_path):
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    ours = torch.load(prepared.token_freq_path, weights_only=True)
    theirs_path = tmp_path / "theirs.pt"
    save_token_frequency_distribution(_rows(prepared.out_dir), theirs_path)
    assert ours == torch.load(theirs_path, weights_only=True)
    assert all(type(k) is int and type(v) is int for k, v in ours.items())
    assert sum(ours.values()) == prepared.loss_tokens


def test_rows_are_truncated_to_max_seq_len(tiny_target, chats, tmp_path):
    result = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=chats, out_dir=tmp_path / "o",
                     max_seq_len=24)
    lengths = _rows(result.out_dir).with_format(None)["seq_len"]
    assert max(lengths) == 24
    assert result.num_truncated_rows > 0 and result.num_turns_dropped > 0
    assert result.truncated_loss_tokens > 0
    assert result.total_tokens == sum(lengths)


def test_a_truncated_row_counts_exactly_the_supervised_tokens_cut_off(tiny_target, tokenizer, tmp_path):
    reply = "The river carries stone and water past the old castle 🙂 你好世界. " * 8
    messages = [{"role": "user", "content": "Tell me about the river."}, {"role": "assistant", "content": reply}]
    ids = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=True, return_dict=True, add_generation_prompt=True)
    boundary = len(prompt["input_ids"])
    mask = [0] * boundary + [1] * (len(ids) - boundary)  # speculators' render-boundary rule
    max_seq_len = mask.index(1) + 10  # the row keeps its context and the first 10 reply tokens
    assert len(ids) > max_seq_len
    result = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=_write(tmp_path, [{"messages": messages}]),
                     out_dir=tmp_path / "o", max_seq_len=max_seq_len)
    row = _rows(result.out_dir).with_format(None)[0]
    assert row["input_ids"] == ids[:max_seq_len] and sum(row["loss_mask"]) == 10
    assert (result.num_truncated_rows, result.truncated_loss_tokens) == (1, sum(mask[max_seq_len:]))
    assert result.truncated_loss_tokens == sum(mask) - 10 > 0
    assert json.loads((result.out_dir / "prepare_summary.json").read_text())["truncated_loss_tokens"] == (
        result.truncated_loss_tokens)


def test_long_unicode_chats_in_both_formats_keep_every_reply_whole_or_count_the_cut(tiny_target, tokenizer,
                                                                                   tmp_path):
    rows = long_chat_rows(4, seed=3)
    assert {"messages", "conversations"} <= {k for r in rows for k in r}
    convs = {str(r["id"]): _messages(r) for r in rows}
    full = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=_write(tmp_path, rows),
                   out_dir=tmp_path / "full", max_seq_len=2048)
    assert (full.num_truncated_rows, full.truncated_loss_tokens, full.num_turns_dropped) == (0, 0, 0)
    seen = Counter()
    for row in _rows(full.out_dir).with_format(None):
        replies = [t["content"] for j, t in enumerate(convs[row["source_id"]]) if t["role"] == "assistant" and j > 0]
        masked = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
        assert tokenizer.decode(masked) == replies[seen[row["source_id"]]] + tokenizer.eos_token + "\n"
        seen[row["source_id"]] += 1
    assert max(_rows(full.out_dir).with_format(None)["seq_len"]) > 300
    # Clipped at 300 tokens: what the rows keep plus what the result says was cut is every
    # supervised token of the turns that were not dropped.
    clipped = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=_write(tmp_path, rows),
                      out_dir=tmp_path / "clipped", max_seq_len=300)
    full_rows, kept = Counter(), Counter()  # per conversation; dropped turns are its last ones
    for r in _rows(clipped.out_dir).with_format(None):
        kept[r["source_id"]] += 1
    for r in _rows(full.out_dir).with_format(None):
        if full_rows[r["source_id"], "n"] < kept[r["source_id"]]:
            full_rows[r["source_id"], "n"] += 1
            full_rows["loss"] += sum(r["loss_mask"])
    assert clipped.num_truncated_rows > 0 and clipped.truncated_loss_tokens > 0 and clipped.num_turns_dropped > 0
    assert clipped.loss_tokens + clipped.truncated_loss_tokens == full_rows["loss"]


def test_excluded_ids_are_skipped(tiny_target, chats, tmp_path):
    ids = [json.loads(line)["id"] for line in chats.read_text().splitlines()]
    result = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=chats, out_dir=tmp_path / "o",
                     max_seq_len=256, exclude_ids=frozenset(ids[:3]))
    kept = set(_rows(result.out_dir).with_format(None)["source_id"])
    assert kept == set(ids[3:])
    assert (result.num_excluded, result.num_skipped, result.num_conversations) == (3, 3, SUBSET - 3)


def test_row_id_defaults_to_zero_based_line_index(tiny_target, tmp_path):
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    path = _write(tmp_path, [chat, chat, chat])
    result = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=path, out_dir=tmp_path / "o",
                     max_seq_len=64, exclude_ids=frozenset({"1"}))
    assert _rows(result.out_dir).with_format(None)["source_id"] == ["0", "2"]


def test_conversation_without_a_reply_after_context_is_skipped(tiny_target, tmp_path):
    rows = [
        {"conversations": [{"from": "gpt", "value": "I speak first."}]},
        {"conversations": [{"from": "human", "value": "Hi"}]},
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
    ]
    result = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=_write(tmp_path, rows),
                     out_dir=tmp_path / "o", max_seq_len=64)
    assert (result.num_rows, result.num_without_assistant, result.num_skipped) == (1, 2, 2)


def test_max_samples_caps_rows(tiny_target, chats, tmp_path):
    result = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=chats, out_dir=tmp_path / "o",
                     max_seq_len=256, max_samples=5)
    assert result.num_rows == len(_rows(result.out_dir)) == 5


@pytest.mark.parametrize(
    "bad, problem",
    [
        ('{"messages": [', "not valid JSON"),
        ({"turns": []}, "no 'conversations'"),
        ({"conversations": [{"from": "robot", "value": "x"}]}, "unknown role 'robot'"),
        ({"messages": [{"role": "user", "content": ["x"]}]}, "content must be a string"),
        ({"messages": [{"role": "user", "content": None}]}, "content must be a string"),
    ],
)
def test_malformed_row_names_file_line_and_problem(tiny_target, tmp_path, bad, problem):
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    path = _write(tmp_path, [good, bad])
    with pytest.raises(DatasetFormatError) as err:
        prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=path, out_dir=tmp_path / "o", max_seq_len=64)
    assert f"{path}, line 2" in str(err.value) and problem in str(err.value)
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_length_histogram_counts_every_row(prepared):
    hist = prepared.length_histogram
    assert hist["edges"][0] == 0 and hist["edges"][-1] == prepared.max_seq_len
    assert len(hist["counts"]) == len(hist["edges"]) - 1
    assert sum(hist["counts"]) == prepared.num_rows


def test_summary_file_records_the_result(prepared):
    summary = json.loads((prepared.out_dir / "prepare_summary.json").read_text())
    assert summary == json.loads(json.dumps(prepared.as_dict()))


def test_refuses_a_non_empty_output_directory(tiny_target, chats, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=chats, out_dir=tmp_path / "o", max_seq_len=64)


def test_progress_reaches_the_line_count(tiny_target, chats, tmp_path):
    calls = []
    prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=chats, out_dir=tmp_path / "o", max_seq_len=64,
            on_progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (SUBSET, SUBSET)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
