"""Our prepare stage against speculators 0.9's own `prepare-data` code, run on the same rows.

Upstream's `build_speculator_training_dataset` renders every conversation through vLLM's
`/v1/chat/completions/render` endpoint. vLLM is not installed here and its engine needs a
device, so a small HTTP server answers that endpoint with the target tokenizer's chat template
(what vLLM's render applies), truncated on the right as upstream asks. Everything else is
upstream's code unchanged: its render client, boundary rule, row filter and token counter.
Upstream's prepare-data reads only the `conversations` column, so OpenAI-style rows are handed
to it under that key (its `_normalize_conversation` reads role/content there).
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from workers.stages.prepare.render import MASK_SOURCE
from workers.stages.prepare.stage import prepare

ODD = [
    "👩‍👩‍👧 family, e\u0301 (combining), مرحبا, 漢字かな, zero\u200bwidth",
    "line\u2028separator and tab\there, «quotes», ﬁ ligature, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "",  # an empty reply still ends its turn
    "emoji at the end 🚀🔥",
]


def _odd_rows() -> list[dict]:
    sharegpt = [
        {"id": "sg-multi", "conversations": [
            {"from": "system", "value": "Be brief. ⚙️"},
            {"from": "human", "value": ODD[0]}, {"from": "gpt", "value": ODD[1]},
            {"from": "human", "value": "and?"}, {"from": "gpt", "value": ODD[2]},
            {"from": "human", "value": "again"}, {"from": "gpt", "value": ODD[3]},
            {"from": "human", "value": "a trailing question nobody answers"}]},
        {"id": "sg-assistant-first", "conversations": [
            {"from": "gpt", "value": "I speak first"}, {"from": "human", "value": ODD[3]},
            {"from": "gpt", "value": ODD[0]}]},
    ]
    openai = [
        {"id": "oa-multi", "messages": [
            {"role": "user", "content": ODD[1]}, {"role": "assistant", "content": ODD[0]},
            {"role": "user", "content": ODD[3]}, {"role": "assistant", "content": ODD[1] * 3}]},
        {"id": "oa-system", "messages": [
            {"role": "system", "content": "ünïcödé system"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": ODD[3]}]},
    ]
    return sharegpt + openai


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_target.target_dir), local_files_only=True)


@pytest.fixture(scope="module")
def render_endpoint(tokenizer):
    """Stand-in for vLLM's /v1/chat/completions/render: the tokenizer's chat template."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                assert self.path == "/v1/chat/completions/render", self.path
                with lock:  # fast tokenizers are not safe to share across threads
                    ids = list(tokenizer.apply_chat_template(
                        body["messages"], tokenize=True, return_dict=True,
                        add_generation_prompt=body["add_generation_prompt"])["input_ids"])
                if body.get("truncate_prompt_tokens") is not None:
                    assert body.get("truncation_side") == "right"
                    ids = ids[: body["truncate_prompt_tokens"]]
                status, payload = 200, {"token_ids": ids}
            except Exception as exc:  # noqa: BLE001 - vLLM answers a bad render with a 400
                status, payload = 400, {"error": str(exc)}
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def chat_file(tiny_target, tmp_path_factory):
    demo = [json.loads(line) for line in tiny_target.chats_path.read_text().splitlines()[:40]]
    rows = demo + _odd_rows()
    assert {"conversations", "messages"} <= {k for r in rows for k in r}  # both formats present
    path = tmp_path_factory.mktemp("parity") / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path, rows


def _upstream(rows: list[dict], *, tokenizer, endpoint: str, max_length: int):
    """speculators' build_speculator_training_dataset, one dataset per chat format (its Arrow
    schema cannot mix from/value and role/content turns), rows in input order."""
    from datasets import Dataset

    from speculators.data_generation.preprocessing import build_speculator_training_dataset

    out = {}
    for fmt, key in (("sharegpt", "conversations"), ("openai", "messages")):
        convs = [r[key] for r in rows if key in r]
        ds = build_speculator_training_dataset(
            Dataset.from_dict({"conversations": convs}), tokenizer, max_length=max_length, num_proc=1,
            render_endpoint=endpoint)
        out[fmt] = ds
    return out


@pytest.mark.parametrize("max_len", [256, 40])
def test_loss_mask_equals_upstream_prepare_data_token_for_token_with_a_tokenizer_render_server_standing_in_for_vllm(
    tiny_target, tokenizer, render_endpoint, chat_file, tmp_path, max_len
):
    from datasets import concatenate_datasets, load_from_disk

    from speculators.train.vocab_mapping import save_token_frequency_distribution

    path, rows = chat_file
    ours = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=path, out_dir=tmp_path / "ours",
                   max_seq_len=max_len)
    theirs = _upstream(rows, tokenizer=tokenizer, endpoint=render_endpoint, max_length=max_len)

    fmt_of = {str(r["id"]): "sharegpt" if "conversations" in r else "openai" for r in rows}
    mine = load_from_disk(str(ours.out_dir)).with_format(None)
    for fmt in ("sharegpt", "openai"):
        our_rows = [(r["input_ids"], r["loss_mask"]) for r in mine if fmt_of[r["source_id"]] == fmt]
        their_rows = [(r["input_ids"], r["loss_mask"]) for r in theirs[fmt].with_format(None)]
        assert len(our_rows) == len(their_rows) > 0, fmt
        for n, (a, b) in enumerate(zip(our_rows, their_rows)):
            assert a == b, f"{fmt} row {n} differs from upstream"

    both = concatenate_datasets([theirs["sharegpt"], theirs["openai"]])
    save_token_frequency_distribution(both, tmp_path / "theirs.pt")
    assert torch.load(ours.token_freq_path, weights_only=True) == torch.load(tmp_path / "theirs.pt",
                                                                               weights_only=True)
    assert ours.num_rows == len(both)
    assert ours.loss_tokens == sum(int(r["loss_mask"].sum()) for r in both)
    assert ours.total_tokens == sum(len(r["input_ids"]) for r in both)
    assert ours.mask_source == MASK_SOURCE == "render_boundary"


def test_odd_unicode_rows_supervise_reply_end_token_and_trailing_newline_like_upstream(
    tiny_target, tokenizer, chat_file, tmp_path
):
    from datasets import load_from_disk

    path, rows = chat_file
    ours = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=path, out_dir=tmp_path / "o", max_seq_len=256)
    mine = [r for r in load_from_disk(str(ours.out_dir)).with_format(None) if r["source_id"] == "sg-multi"]
    # three assistant turns after the first message; the trailing user turn adds nothing
    assert len(mine) == 3
    for row, reply in zip(mine, ODD[1:]):
        masked = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
        assert tokenizer.decode(masked) == reply + tokenizer.eos_token + "\n"
        assert row["loss_mask"][-len(masked):] == [1] * len(masked)  # one span, at the end
    first = [r for r in load_from_disk(str(ours.out_dir)).with_format(None) if r["source_id"] == "sg-assistant-first"]
    assert len(first) == 1  # the opening assistant turn has no context and is never a row


def test_a_conversation_whose_history_renders_unstably_loses_every_row_as_upstream_drops_it(
    tiny_target, tmp_path
):
    """preprocessing.py:363-376 catches BoundaryUnstableError for the whole conversation."""
    import shutil

    from datasets import load_from_disk

    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_target.target_dir / name, tok / name)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    # From the fourth message on, every render opens with "X": turn 1 bounds cleanly, turn 3's
    # prompt (3 messages) and full render (4) diverge at the first token, inside the history.
    cfg["chat_template"] = "{% if messages|length > 3 %}X{% endif %}" + cfg["chat_template"]
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    rows = [{"id": "unstable", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                                            {"role": "user", "content": "more"}, {"role": "assistant", "content": "b"}]},
            {"id": "ok", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = prepare(tokenizer_dir=tok, dataset_path=path, out_dir=tmp_path / "o", max_seq_len=256)
    ds = load_from_disk(str(result.out_dir)).with_format(None)
    assert ds["source_id"] == ["ok"]  # turn 1 of "unstable" bounded cleanly, yet goes with its conversation
    assert (result.num_rows, result.num_turns_dropped, result.num_without_assistant) == (1, 2, 1)


def test_recorded_reasoning_reaches_the_chat_template_under_both_names_as_upstream_passes_it():
    from pathlib import Path

    from workers.contract.chats.jsonl import parse_row

    row = {"messages": [{"role": "user", "content": "q"},
                        {"role": "assistant", "content": "a", "reasoning_content": "think ✓"}]}
    conv = parse_row(json.dumps(row), path=Path("x.jsonl"), line=1)
    assert conv.messages[1] == {"role": "assistant", "content": "a", "thinking": "think ✓",
                                "reasoning_content": "think ✓"}
    sharegpt = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a", "thinking": "t"}]}
    assert parse_row(json.dumps(sharegpt), path=Path("x.jsonl"), line=1).messages[1]["reasoning_content"] == "t"
