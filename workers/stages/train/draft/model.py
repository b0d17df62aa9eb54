"""The draft the training stage trains, and its optimizer, built as `speculators train` builds them with its
eagle3 defaults (workers/stages/train/draft/config.py writes the same draft's config.json without torch)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from speculators.models.eagle3 import Eagle3DraftModel  # noqa: E402
from speculators.train.cli import create_transformer_layer_config  # noqa: E402
from transformers import get_linear_schedule_with_warmup  # noqa: E402

from workers.contract.target import read_target_config, validate_layer_ids  # noqa: E402
from workers.stages.train.data import TrainInputError  # noqa: E402


def build_draft_model(*, target_dir: Path, layer_ids: list[int], d2t_path: Path, t2d_path: Path,
                      draft_vocab_size: int, ttt_steps: int, seed: int = 0) -> Eagle3DraftModel:
    """A fresh 1-layer draft exactly as `speculators train` builds one with its eagle3 defaults."""
    target = read_target_config(target_dir)
    validate_layer_ids(layer_ids, target.num_layers)
    d2t = torch.from_numpy(np.load(d2t_path))
    t2d = torch.from_numpy(np.load(t2d_path))
    if d2t.shape[0] != draft_vocab_size:
        raise TrainInputError(f"{d2t_path}: {d2t.shape[0]} entries, but draft_vocab_size is {draft_vocab_size}")
    if t2d.shape[0] != target.vocab_size:
        raise TrainInputError(f"{t2d_path}: {t2d.shape[0]} entries, but the target vocabulary has {target.vocab_size}")
    torch.manual_seed(seed)
    # TrainConfig._resolve_derived_defaults for eagle3: llama draft, 1 layer, norm_before_fc,
    # norm_output, norm_before_residual; DraftArgs: sliding_window 2048, no full-attention layers.
    layer_config = create_transformer_layer_config(
        verifier_name_or_path=str(target_dir), num_layers=1, draft_arch="llama", hidden_act=None,
        sliding_window=2048, full_attention_indices=[])
    model = Eagle3DraftModel.from_training_args(
        verifier_config=layer_config, t2d=t2d.to(torch.bool), d2t=d2t.to(torch.long),
        verifier_name_or_path=str(target_dir), draft_vocab_size=draft_vocab_size, norm_before_residual=True,
        norm_before_fc=True, norm_output=True, ttt_steps=ttt_steps, target_layer_ids=list(layer_ids[:-1]),
        draft_attn_impl="eager")
    Eagle3DraftModel.verify_training_compatible(model)
    return model


def model_call_kwargs(ttt_steps: int) -> dict:
    """Eagle3DraftModel.get_trainer_kwargs with loss kl_div, eager implementation, no decay."""
    train_kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", ttt_steps=ttt_steps, ttt_step_loss_decay=1.0)
    return train_kwargs


def make_optimizer(model: torch.nn.Module, *, lr: float, total_steps: int):
    """AdamW as build_optimizers("adamw") makes it; linear decay with 1% warmup (at least one step)."""
    optimizer = torch.optim.AdamW(model.named_parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, total_steps // 100)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, max(total_steps, warmup + 1))
