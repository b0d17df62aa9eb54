"""bench/gpu/gpu_check.py's inputs, built offline: a Llama-architecture target with random weights and
a tokenizer trained on the demo chats, and single-reply chats of a chosen length made of their texts."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from gpu_peaks import target_forward_flops_per_token


def build_target(work: Path, shape: dict, device: torch.device, seed: int) -> tuple[Path, Path, dict]:
    """(target dir with config, random weights and tokenizer; the demo chats; what was built)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.stages.demo.assets import _save_tokenizer, train_demo_tokenizer
    from workers.stages.demo.chats import read_chat_messages, write_demo_chats

    started = time.perf_counter()
    target_dir, chats_path = work / "target", work / "demo-chats.jsonl"
    write_demo_chats(chats_path, num_conversations=shape["demo_conversations"], seed=seed)
    tokenizer = train_demo_tokenizer(read_chat_messages(chats_path))
    # The demo's own writer: a tokenizer config that transformers 4.x and 5.x (and vLLM) all read.
    _save_tokenizer(tokenizer, target_dir)
    config = LlamaConfig(
        vocab_size=max(shape["vocab_size"], len(tokenizer)), hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["num_attention_heads"], num_key_value_heads=shape["num_key_value_heads"],
        max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    # Initialised on the GPU (seconds, where the CPU takes a minute for 1B parameters) and stored in
    # the dtype the stages load it in there.
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    params = sum(p.numel() for p in model.parameters())
    flops = target_forward_flops_per_token(model)
    model.save_pretrained(target_dir, safe_serialization=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    info = {"params": params, "forward_flops_per_token": flops, "tokenizer_tokens": len(tokenizer),
            "build_s": round(time.perf_counter() - started, 2),
            **{k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "intermediate_size", "vocab_size")}}
    return target_dir, chats_path, info


def write_long_chats(path: Path, target_dir: Path, demo_chats: Path, shape: dict, seed: int) -> None:
    """Single-reply chats of min..max tokens (uniform), their texts drawn from the demo chats:
    one prepared row each, about 1/8 prompt and 7/8 reply."""
    from workers.stages.demo.chats import read_chat_messages
    from workers.stages.prepare.render import load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    texts = [m["content"] for chat in read_chat_messages(demo_chats) for m in chat]
    counts = [len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]  # +1: the "\n"
    rng = random.Random(seed)

    def draw(budget: int) -> str:
        picked, used = [], 0
        while used < budget:
            i = rng.randrange(len(texts))
            picked.append(texts[i])
            used += counts[i]
        return "\n".join(picked)

    with path.open("w", encoding="utf-8") as f:
        for row in range(shape["rows"]):
            want = rng.randint(shape["min_tokens"], shape["max_tokens"]) - 16  # room for the template's tokens
            messages = [{"role": "user", "content": draw(want // 8)},
                        {"role": "assistant", "content": draw(want - want // 8)}]
            f.write(json.dumps({"id": f"gpu-check-{row:05d}", "messages": messages}) + "\n")
