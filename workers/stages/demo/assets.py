"""A demo target built offline: procedural chats, a BPE tokenizer and a small trained Llama.

`make demo` and the test suite need a real target with no model hub. Everything here is
deterministic for a given seed, so two builds with the same parameters hold the same chats and
the same tokenizer. The chats have learnable structure (sums with answers, capitals, spelling...)
so the trained target's hidden states carry signal and a draft trained on them can show
acceptance well above chance.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

# Read by huggingface_hub at import time: this stage must never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from workers.stages.demo.chats import read_chat_messages, write_demo_chats  # noqa: E402
from workers.contract.demo_build import (  # noqa: E402
    BUILD_INFO_FILENAME,
    CHATS_FILENAME,
    DEFAULT_CONVERSATIONS,
    DEFAULT_TRAIN_STEPS,
    TARGET_DIRNAME,
    build_params,
    finished_build_info,
)

log = logging.getLogger(__name__)


BOS, EOS, PAD = "<|begin|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLE_TOKENS.values()]
VOCAB_SIZE = 3072
NUM_LAYERS = 8
HIDDEN_SIZE = 128
MAX_SEQ_LEN = 512
BATCH_SIZE = 16
LEARNING_RATE = 3e-3

# The {% generation %} block covers the reply and its end token, so assistant masks teach the
# model (and a draft) where a reply stops.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('demo template supports system, user and assistant roles, got ' + message['role']) }}"
    "{% endif %}{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@dataclass(frozen=True)
class DemoAssets:
    target_dir: Path
    chats_path: Path
    num_conversations: int
    vocab_size: int
    num_layers: int
    hidden_size: int
    initial_loss: float
    final_loss: float
    seconds: float

    def as_dict(self) -> dict:
        d = asdict(self)
        d["target_dir"], d["chats_path"] = str(self.target_dir), str(self.chats_path)
        return d



def build_demo_assets(
    out_dir: Path,
    *,
    num_conversations: int = DEFAULT_CONVERSATIONS,
    train_steps: int = DEFAULT_TRAIN_STEPS,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> DemoAssets:
    """Build (or reuse) out_dir/demo-chats.jsonl and out_dir/demo-target/.

    A build is reused when out_dir/demo-build.json records the same parameters; that file is
    written last, so a build interrupted half-way is redone rather than trusted.
    """
    if num_conversations < 1 or train_steps < 1:
        raise ValueError(f"num_conversations and train_steps must be at least 1, got {num_conversations} and {train_steps}")
    out_dir = Path(out_dir)
    params = build_params(num_conversations=num_conversations, train_steps=train_steps, seed=seed)
    total = train_steps + 3
    existing = _reusable_build(out_dir, params)
    if existing is not None:
        log.info("demo assets in %s already built with %s; reusing them", out_dir, params)
        if on_progress:
            on_progress(total, total)
        return existing

    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / BUILD_INFO_FILENAME).unlink(missing_ok=True)
    target_dir = out_dir / TARGET_DIRNAME
    chats_path = out_dir / CHATS_FILENAME
    if target_dir.exists():
        shutil.rmtree(target_dir)
    target_dir.mkdir()

    write_demo_chats(chats_path, num_conversations=num_conversations, seed=seed)
    chats = read_chat_messages(chats_path)
    if on_progress:
        on_progress(1, total)

    tokenizer = train_demo_tokenizer(chats)
    _save_tokenizer(tokenizer, target_dir)
    if on_progress:
        on_progress(2, total)

    model, initial_loss, final_loss = _train_target(
        tokenizer, chats, train_steps=train_steps, seed=seed,
        on_step=(lambda step: on_progress(2 + step, total)) if on_progress else None,
    )
    model.save_pretrained(target_dir, safe_serialization=True)
    if on_progress:
        on_progress(total, total)

    assets = DemoAssets(
        target_dir=target_dir, chats_path=chats_path, num_conversations=num_conversations,
        vocab_size=model.config.vocab_size, num_layers=model.config.num_hidden_layers,
        hidden_size=model.config.hidden_size, initial_loss=initial_loss, final_loss=final_loss,
        seconds=round(time.monotonic() - started, 2),
    )
    info = {"params": params, "result": assets.as_dict()}
    (out_dir / BUILD_INFO_FILENAME).write_text(json.dumps(info, indent=2) + "\n")
    log.info("demo assets built in %.1f s: loss %.3f -> %.3f", assets.seconds, initial_loss, final_loss)
    return assets


def train_demo_tokenizer(chats: list[list[dict]], *, vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Byte-level BPE over the chat contents, with the role markers as special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps offsets on the leading space, so char_to_token (used for assistant
    # masks) finds a token for every character of a reply.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((m["content"] + "\n" for chat in chats for m in chat), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, extra_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=MAX_SEQ_LEN * 2, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _save_tokenizer(tokenizer: PreTrainedTokenizerFast, target_dir: Path) -> None:
    """Save so that transformers 4.x (vLLM's) and 5.x both load it and find the chat template.

    5.x writes its own class name, a list-valued `extra_special_tokens` and a separate
    chat_template.jinja; 4.x knows none of these, while 5.x still reads the older spellings.
    """
    tokenizer.save_pretrained(target_dir, save_jinja_files=False)
    path = Path(target_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.pop("backend", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["additional_special_tokens"] = config.pop("extra_special_tokens", list(ROLE_TOKENS.values()))
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _train_target(
    tokenizer: PreTrainedTokenizerFast,
    chats: list[list[dict]],
    *,
    train_steps: int,
    seed: int,
    on_step: Callable[[int], None] | None,
) -> tuple[LlamaForCausalLM, float, float]:
    torch.manual_seed(seed)
    encoded = [tokenizer.apply_chat_template(c, tokenize=True, return_dict=False)[:MAX_SEQ_LEN] for c in chats]
    rng = random.Random(seed + 1)
    rng.shuffle(encoded)
    # A fixed held-out batch, scored before and after, so the loss drop is measured on the same tokens.
    held_out, train = (encoded[:32], encoded[32:]) if len(encoded) > 64 else (encoded[:8], encoded)

    # Two KV heads per four query heads: grouped-query attention, as in the Llama targets users bring.
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=HIDDEN_SIZE, intermediate_size=384, num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    batch_size, lr, warmup = BATCH_SIZE, LEARNING_RATE, max(1, train_steps // 20)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, train_steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        initial_loss = _score(model, held_out, tokenizer.pad_token_id)
        model.train()
        batches = _length_bucketed(train, batch_size, rng)
        for step in range(train_steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            ids, labels, mask = _pad_batch(next(batches), tokenizer.pad_token_id)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 50 == 0:
                log.info("demo target step %d/%d loss %.3f", step, train_steps, loss.item())
            if on_step:
                on_step(step + 1)
        final_loss = _score(model, held_out, tokenizer.pad_token_id)
    finally:
        torch.set_num_threads(previous_threads)
    model.eval()
    return model, initial_loss, final_loss


@torch.no_grad()
def _score(model: LlamaForCausalLM, seqs: list[list[int]], pad_id: int) -> float:
    model.eval()
    ids, labels, mask = _pad_batch(seqs, pad_id)
    return round(float(model(input_ids=ids, attention_mask=mask, labels=labels).loss), 4)


def _length_bucketed(seqs: list[list[int]], batch_size: int, rng: random.Random) -> Iterator[list[list[int]]]:
    """Endless batches of similar-length chats: random batches would be half padding."""
    by_length = sorted(seqs, key=len)
    batches = [by_length[i : i + batch_size] for i in range(0, len(by_length), batch_size)]
    while True:
        rng.shuffle(batches)
        yield from batches


def _pad_batch(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s)
        mask[row, : len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return ids, labels, mask



def _reusable_build(out_dir: Path, params: dict) -> DemoAssets | None:
    info = finished_build_info(out_dir, params)
    if info is None:
        return None
    # Paths are re-derived so a moved out_dir still resolves.
    try:
        return DemoAssets(**{**info["result"], "target_dir": out_dir / TARGET_DIRNAME,
                             "chats_path": out_dir / CHATS_FILENAME})
    except (KeyError, TypeError):
        return None


# --- procedural chats: small facts and rules a 2M-parameter model can pick up ---
