"""bench/gpu/gpu_check.py's `train_kimi_width` stage: a draft for Kimi-K2.5's width trained for a few steps
from synthetic hidden states, through the training loop's own step (workers.stages.train.step.stepper).

The target is not needed to train: the draft reads the target's config, its embeddings, final norm
and lm_head (speculators' load_verifier_weights), so the target folder here holds Kimi-K2.5's
shape as a Llama config (hidden 7168, 61 layers, 64 heads, intermediate 18432, vocabulary 163,840)
and those three tensors, random. Hidden states are random bf16 at the layer ids the seed run used
([2, 30, 58, 60]); packed steps of documents of 1,024-2,048 tokens, `tokens_per_step` each.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

# Kimi-K2.5's attention has 64 heads with values of 128 (MLA); the Llama draft takes head_dim 128.
KIMI = dict(hidden_size=7168, num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64, head_dim=128,
            intermediate_size=18432, vocab_size=163840)
TINY = dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            intermediate_size=512, vocab_size=4096)
KIMI_LAYER_IDS = [2, 30, 58, 60]
KIMI_DRAFT_VOCAB = 32000


def write_kimi_target(folder: Path, device: torch.device, shape: dict = KIMI) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "rope_theta": 50000.0,
              "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, **shape}
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator(device=device).manual_seed(0)
    hidden, vocab = shape["hidden_size"], shape["vocab_size"]
    tensors = {name: (torch.randn(vocab, hidden, generator=gen, device=device, dtype=torch.bfloat16) * 0.02).cpu()
               for name in ("model.embed_tokens.weight", "lm_head.weight")}
    tensors["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def write_vocab(folder: Path, target_vocab: int, draft_vocab: int) -> tuple[Path, Path]:
    ids = np.sort(np.random.default_rng(0).choice(target_vocab, draft_vocab, replace=False))
    t2d = np.zeros(target_vocab, dtype=bool)
    t2d[ids] = True
    np.save(folder / "d2t.npy", (ids - np.arange(draft_vocab)).astype(np.int64))
    np.save(folder / "t2d.npy", t2d)
    return folder / "d2t.npy", folder / "t2d.npy"


def synthetic_step(hidden: int, layers: int, vocab: int, tokens: int, seed: int, device: torch.device) -> dict:
    """One packed step in the layout workers.stages.train.data.iter_batches collates (already shifted)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    lengths, left = [], tokens
    rng = np.random.default_rng(seed)
    while left > 0:
        n = min(left, int(rng.integers(1024, 2049)))
        lengths.append(n)
        left -= n
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    position = torch.cat([torch.arange(n, device=device) for n in lengths])
    mask = torch.cat([(torch.arange(n, device=device) >= n // 8).long() for n in lengths])
    return {"hidden_states": torch.randn(1, tokens, (layers - 1) * hidden, generator=gen, device=device,
                                         dtype=torch.bfloat16),
            "verifier_last_hidden_states": torch.randn(1, tokens, hidden, generator=gen, device=device,
                                                       dtype=torch.bfloat16),
            "input_ids": torch.randint(0, vocab, (1, tokens), generator=gen, device=device),
            "loss_mask": mask.unsqueeze(0), "position_ids": position.unsqueeze(0), "document_ids": doc.unsqueeze(0)}


def train_kimi_width(work: Path, device: torch.device, *, steps: int, tokens_per_step: int, ttt_steps: int,
                     shape: dict = KIMI, layer_ids: list[int] = KIMI_LAYER_IDS,
                     draft_vocab: int = KIMI_DRAFT_VOCAB) -> dict:
    from gpu_peaks import draft_train_flops_per_token

    from workers.stages.train.draft.model import build_draft_model, make_optimizer
    from workers.stages.train.step.stepper import DraftStepper

    started = time.perf_counter()
    target = write_kimi_target(work / "kimi-target", device, shape)
    d2t, t2d = write_vocab(work, shape["vocab_size"], draft_vocab)
    model = build_draft_model(target_dir=target, layer_ids=layer_ids, d2t_path=d2t, t2d_path=t2d,
                              draft_vocab_size=draft_vocab, ttt_steps=ttt_steps)
    flops = draft_train_flops_per_token(model, ttt_steps)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    model.to(device).train()
    setup_s = time.perf_counter() - started
    stepper = DraftStepper(model, device=device, ttt_steps=ttt_steps)
    optimizer, scheduler = make_optimizer(model, lr=1e-4, total_steps=steps + 1)
    batches = [synthetic_step(shape["hidden_size"], len(layer_ids), shape["vocab_size"], tokens_per_step, s, device)
               for s in range(2)]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    stepper.train_step(batches[0], optimizer, scheduler)  # warm-up: compiles, autotunes
    warm = stepper.times.as_dict()
    t0 = time.perf_counter()
    losses = []
    for s in range(steps):
        _loss, metrics = stepper.train_step(batches[s % 2], optimizer, scheduler)
        losses.append(metrics["loss_sum"])
    seconds = time.perf_counter() - t0
    split = {k: round(v - warm[k], 4) for k, v in stepper.times.as_dict().items()}
    return {"tokens": steps * tokens_per_step, "tokens_per_s": steps * tokens_per_step / seconds,
            "flops_per_token": flops, "params": params, "trainable_params": trainable, "setup_s": round(setup_s, 2),
            "steps_timed": steps, "tokens_per_step": tokens_per_step, "losses": [round(x, 4) for x in losses],
            "step_config": stepper.describe(), "graphs_compiled": stepper.graphs_compiled(),
            "time_split_s": split, "shape": {**shape, "layer_ids": layer_ids, "draft_vocab_size": draft_vocab},
            "tokens_per_s_is": "timed steps after one warm-up step (compile and autotune excluded)"}
