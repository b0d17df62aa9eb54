"""Chats shaped like users' data, and training inputs built from them through the real prepare stage.

Real chat datasets have many turns per conversation, long replies and text the demo tokenizer
never saw (emoji, CJK, combining marks, right-to-left scripts), so the prepared rows run to
hundreds of tokens and each row's supervised tokens (its last reply) sit at its end. Rows come
in both chat formats: ShareGPT (`conversations` with from/value) and OpenAI (`messages` with
role/content). Everything is deterministic for a seed.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

ENGLISH = ("the river carries stone and water past the old castle while a friend reads the paper by the "
           "window in summer light and the garden grows green under a silver cloud").split()
ODD = [
    "🙂", "🚀", "👩‍💻", "🇯🇵", "✨",  # emoji, a ZWJ sequence, a flag
    "你好世界", "数据集", "東京タワー", "한국어 문장",  # CJK and Hangul
    "e\u0301te\u0301", "n\u0303", "Zu\u0308rich",  # combining marks (NFD)
    "שלום עולם", "مرحبا بالعالم", "\u200fRTL\u200e",  # Hebrew, Arabic, direction marks
    "naïve café", "Ωμέγα", "ß", "∑ x² ≤ ∞",
]
SYSTEM_PROMPTS = ["You are a helpful assistant. 🙂", "Réponds brièvement. 答えは短く。", "אתה עוזר מועיל."]


def _text(rng: random.Random, words: int, odd_share: float = 0.25) -> str:
    out = [rng.choice(ODD) if rng.random() < odd_share else rng.choice(ENGLISH) for _ in range(words)]
    if rng.random() < 0.3:
        out.insert(rng.randrange(len(out)), "\n- item: " + rng.choice(ODD))
    return " ".join(out) + rng.choice([".", "?", "!", " 🙂", "。"])


def long_conversation(rng: random.Random, *, turns: int, user_words: tuple[int, int],
                      reply_words: tuple[int, int]) -> list[dict]:
    """system? then `turns` user/assistant exchanges; the first user message is a long paste."""
    messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] if rng.random() < 0.5 else []
    for t in range(turns):
        lo, hi = user_words
        messages.append({"role": "user", "content": _text(rng, rng.randint(lo, hi) * (3 if t == 0 else 1))})
        messages.append({"role": "assistant", "content": _text(rng, rng.randint(*reply_words))})
    return messages


def long_chat_rows(num_conversations: int = 5, *, seed: int = 0, turns: tuple[int, int] = (3, 5),
                   user_words: tuple[int, int] = (5, 12), reply_words: tuple[int, int] = (15, 30)) -> list[dict]:
    """JSONL rows, alternating ShareGPT and OpenAI style, ids mixing strings and integers."""
    rng = random.Random(seed)
    rows = []
    for i in range(num_conversations):
        messages = long_conversation(rng, turns=rng.randint(*turns), user_words=user_words, reply_words=reply_words)
        row_id: str | int = f"conv-{i:02d}-✓" if i % 3 else 1000 + i
        if i % 2:
            rows.append({"id": row_id, "messages": messages})
        else:
            names = {"user": "human", "assistant": "gpt", "system": "system"}
            rows.append({"id": row_id, "conversations": [{"from": names[m["role"]], "value": m["content"]}
                                                          for m in messages]})
    return rows


def write_long_chats(path: Path, **kwargs) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in long_chat_rows(**kwargs)),
                    encoding="utf-8")
    return path


def build_training_inputs(target_dir: Path, chats_path: Path, out: Path, *, max_seq_len: int,
                          draft_vocab_size: int) -> SimpleNamespace:
    """prepare() -> hidden states of the target for every prepared row -> d2t/t2d from token_freq.pt.

    Hidden states are taken as tests/stages/train/test_train.py's write_training_inputs takes them
    (Hugging Face `hidden_states` at the default layer ids); the rows carry `source_id`.
    """
    import numpy as np
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import LlamaForCausalLM

    from workers.stages.prepare.stage import prepare
    from workers.contract.target import default_layer_ids

    prepared = prepare(tokenizer_dir=target_dir, dataset_path=chats_path, out_dir=out / "prepared",
                       max_seq_len=max_seq_len)
    model = LlamaForCausalLM.from_pretrained(target_dir).eval()
    layer_ids = default_layer_ids(model.config.num_hidden_layers)
    hs_dir = out / "hidden_states"
    hs_dir.mkdir(parents=True)
    rows = load_from_disk(str(prepared.out_dir)).with_format(None)
    with torch.no_grad():
        for i, ids in enumerate(rows["input_ids"]):
            states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
            hs = torch.stack([states[j][0] for j in layer_ids], dim=1).to(torch.bfloat16)
            save_file({"token_ids": torch.tensor(ids), "hidden_states": hs}, str(hs_dir / f"hs_{i}.safetensors"))
    freq = torch.load(prepared.token_freq_path, weights_only=True)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, model.config.vocab_size)
    np.save(out / f"d2t-{draft_vocab_size}.npy", d2t.numpy())
    np.save(out / f"t2d-{draft_vocab_size}.npy", t2d.numpy())
    return SimpleNamespace(target_dir=Path(target_dir), prepared_dir=prepared.out_dir, hidden_states_dir=hs_dir,
                           d2t_path=out / f"d2t-{draft_vocab_size}.npy", t2d_path=out / f"t2d-{draft_vocab_size}.npy",
                           layer_ids=layer_ids, draft_vocab_size=draft_vocab_size, prepare_result=prepared,
                           lengths=list(rows["seq_len"]), loss_masks=list(rows["loss_mask"]),
                           source_ids=list(rows["source_id"]))
