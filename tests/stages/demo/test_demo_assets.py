import json
import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.contract.demo_build import BUILD_INFO_FILENAME
from workers.stages.demo.assets import build_demo_assets
from workers.stages.demo.chats import read_chat_messages, write_demo_chats
from workers.contract.target import default_layer_ids, read_target_config

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5."},
    {"role": "user", "content": "Spell the word apple."},
    {"role": "assistant", "content": "apple is spelled a-p-p-l-e."},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    return AutoTokenizer.from_pretrained(tiny_target.target_dir)


def test_chats_file_mixes_sharegpt_and_openai_rows(tiny_target):
    rows = [json.loads(line) for line in tiny_target.chats_path.read_text().splitlines()]
    assert len(rows) == tiny_target.num_conversations == 150
    sharegpt = [r for r in rows if "conversations" in r]
    openai = [r for r in rows if "messages" in r]
    assert len(sharegpt) > 30 and len(openai) > 30 and len(sharegpt) + len(openai) == len(rows)
    assert {t["from"] for r in sharegpt for t in r["conversations"]} <= {"human", "gpt", "system"}
    assert {m["role"] for r in openai for m in r["messages"]} <= {"user", "assistant", "system"}
    assert len({r["id"] for r in rows}) == len(rows)


def test_chats_have_many_distinct_multi_turn_exchanges(tiny_target):
    chats = read_chat_messages(tiny_target.chats_path)
    turns = [(a["content"], b["content"]) for c in chats for a, b in zip(c, c[1:]) if a["role"] == "user"]
    assert len(turns) > 250
    assert len(set(turns)) > 0.8 * len(turns)
    assert {sum(m["role"] == "assistant" for m in c) for c in chats} == {1, 2, 3}
    for chat in chats:
        body = [m["role"] for m in chat if m["role"] != "system"]
        assert body == ["user", "assistant"] * (len(body) // 2)


def test_write_demo_chats_is_deterministic_per_seed(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    assert write_demo_chats(a, num_conversations=50, seed=3) == 50
    write_demo_chats(b, num_conversations=50, seed=3)
    write_demo_chats(c, num_conversations=50, seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_write_demo_chats_refuses_zero_conversations(tmp_path):
    with pytest.raises(ValueError, match="num_conversations"):
        write_demo_chats(tmp_path / "x.jsonl", num_conversations=0)


def test_build_refuses_zero_train_steps_before_touching_out_dir(tmp_path):
    with pytest.raises(ValueError, match="train_steps"):
        build_demo_assets(tmp_path / "out", num_conversations=10, train_steps=0)
    assert not (tmp_path / "out").exists()


def test_tokenizer_chat_template_round_trips(tokenizer):
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, return_dict=False)
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids) == text
    for message in MESSAGES:
        assert message["content"] in text


def test_chat_template_masks_exactly_the_assistant_replies(tokenizer):
    out = tokenizer.apply_chat_template(MESSAGES, tokenize=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(mask) == len(ids)
    kept = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert kept == "2 + 3 = 5.<|end|>apple is spelled a-p-p-l-e.<|end|>"


def test_generation_prompt_render_is_a_token_prefix_of_each_assistant_turn(tokenizer):
    # speculators 0.9 (data_generation/preprocessing.py:_render_boundary_rows) masks a reply as
    # the tokens by which the full render extends the generation-prompt render.
    for j in (2, 4):
        prompt = tokenizer.apply_chat_template(MESSAGES[:j], add_generation_prompt=True, return_dict=False)
        full = tokenizer.apply_chat_template(MESSAGES[: j + 1], return_dict=False)
        assert full[: len(prompt)] == prompt
        assert tokenizer.decode(full[len(prompt) :]) == MESSAGES[j]["content"] + "<|end|>\n"


def test_generation_prompt_opens_an_assistant_turn(tokenizer):
    text = tokenizer.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|user|>\nWhat is 2 + 3?<|end|>\n<|assistant|>\n")


def test_tokenizer_config_carries_chat_template_for_older_transformers(tiny_target):
    config = json.loads((tiny_target.target_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "{% generation %}" in config["chat_template"]
    assert config["additional_special_tokens"] == ["<|system|>", "<|user|>", "<|assistant|>"]


def test_model_loads_as_eight_layer_llama_matching_tokenizer(tiny_target, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_target.target_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == tiny_target.num_layers == 8
    assert model.config.hidden_size == tiny_target.hidden_size == 128
    assert model.config.vocab_size == tiny_target.vocab_size == len(tokenizer)
    assert not model.config.tie_word_embeddings
    assert (tiny_target.target_dir / "model.safetensors").is_file()
    target = read_target_config(tiny_target.target_dir)
    assert default_layer_ids(target.num_layers) == [2, 4, 5, 8]


def test_model_outputs_one_hidden_state_per_layer_plus_embeddings(tiny_target, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_target.target_dir)
    ids = tokenizer.apply_chat_template(MESSAGES, return_tensors="pt", return_dict=True)["input_ids"]
    out = model(input_ids=ids, output_hidden_states=True)
    assert len(out.hidden_states) == 9
    assert out.hidden_states[4].shape == (1, ids.shape[1], 128)


def test_training_lowered_the_measured_loss(tiny_target):
    assert tiny_target.initial_loss > 6.0  # about ln(vocab) for an untrained model
    assert tiny_target.final_loss < tiny_target.initial_loss - 1.0


def test_second_build_with_same_parameters_is_a_no_op(tmp_path):
    first = build_demo_assets(tmp_path, num_conversations=40, train_steps=2, seed=1)
    weights = first.target_dir / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    started = time.monotonic()
    second = build_demo_assets(tmp_path, num_conversations=40, train_steps=2, seed=1)
    assert time.monotonic() - started < 0.5
    assert second == first
    assert weights.stat().st_mtime_ns == stamp


def test_build_is_redone_when_parameters_change_or_build_info_is_missing(tmp_path):
    first = build_demo_assets(tmp_path, num_conversations=40, train_steps=2, seed=1)
    second = build_demo_assets(tmp_path, num_conversations=45, train_steps=2, seed=1)
    assert second.num_conversations == 45
    assert len(second.chats_path.read_text().splitlines()) == 45
    weights = second.target_dir / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    (tmp_path / BUILD_INFO_FILENAME).unlink()
    third = build_demo_assets(tmp_path, num_conversations=45, train_steps=2, seed=1)
    assert weights.stat().st_mtime_ns != stamp
    assert (tmp_path / BUILD_INFO_FILENAME).is_file()
    assert first.target_dir == third.target_dir


def test_build_reports_progress_up_to_the_total(tmp_path):
    calls = []
    build_demo_assets(tmp_path, num_conversations=30, train_steps=3, on_progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (6, 6)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
