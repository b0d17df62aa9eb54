"""Replies from the target loaded with transformers, one conversation at a time.

The prompt is the target tokenizer's chat template over the history with the generation prompt (what
vLLM's /v1/chat/completions renders); generate() decodes greedily at temperature 0, else samples with
torch seeded per reply; the reply is the new tokens decoded without special tokens (what vLLM returns
as the message's content). The model's own generation_config.json supplies the rest (top_k, top_p,
repetition_penalty), as vLLM's `--generation-config auto` does.
"""
from __future__ import annotations

import gc
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from workers.stages.regenerate.base import ConversationFailed, RegenerateError, Reply  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _load(target_dir: Path, dtype: torch.dtype, device: str, tensor_parallel_size: int):
    """(model, where its inputs go, where it runs in words): on one device, or spread over
    tensor_parallel_size GPUs by device_map="auto" as the extraction spreads a large target."""
    from transformers import AutoModelForCausalLM

    from workers.stages.extract.model import place_target

    dev, where = place_target(tensor_parallel_size, device, RegenerateError)
    kwargs = {"dtype": dtype, "attn_implementation": "sdpa", "local_files_only": True}
    if tensor_parallel_size > 1:
        memory = {i: torch.cuda.get_device_properties(i).total_memory for i in range(tensor_parallel_size)}
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), device_map="auto", max_memory=memory, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), **kwargs).to(dev)
    return model.eval(), dev, where


class TransformersReplier:
    concurrency = 1  # one conversation at a time: generate() here is not batched across conversations

    def __init__(self, *, target_dir: Path, dtype: str, device: str, tensor_parallel_size: int, max_new_tokens: int,
                 temperature: float, max_model_len: int):
        import transformers
        from transformers import AutoTokenizer

        self.version = transformers.__version__
        self.tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
        self.model, self.device, self.where = _load(Path(target_dir), TORCH_DTYPES[dtype], device, tensor_parallel_size)
        self.max_new_tokens, self.temperature, self.max_model_len = max_new_tokens, float(temperature), max_model_len
        # The tokens vLLM stops at: the tokenizer's end-of-sequence and the generation config's.
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        if not eos:
            raise RegenerateError(f"target {target_dir} names no end-of-sequence token (tokenizer or generation "
                                  "config), so no reply would ever end")
        self.eos = {int(t) for t in eos}
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos)

    def prompt_ids(self, history: list[dict]) -> list[int]:
        from jinja2 import TemplateError

        try:
            out = self.tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)
        except TemplateError as exc:
            raise ConversationFailed(f"the target's chat template refused the conversation: {exc}") from None
        return list(out["input_ids"])

    @torch.inference_mode()
    def answer(self, history: list[dict], seed: int) -> Reply:
        ids = self.prompt_ids(history)
        if len(ids) + self.max_new_tokens > self.max_model_len:
            # vLLM refuses the same request (HTTP 400): both backends fail the same conversations.
            raise ConversationFailed(f"a prompt of {len(ids)} tokens plus max_new_tokens {self.max_new_tokens} is more "
                                     f"than the max_model_len of {self.max_model_len} tokens")
        sampling = self.temperature > 0
        options = {"do_sample": True, "temperature": self.temperature} if sampling else {"do_sample": False}
        if sampling:
            torch.manual_seed(seed)  # seeds every device too: the reply depends on its seed alone
        inputs = torch.tensor([ids], device=self.device)
        out = self.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                                  max_new_tokens=self.max_new_tokens, eos_token_id=sorted(self.eos),
                                  pad_token_id=self.pad, **options)
        new = out[0, len(ids):].tolist()
        cut = len(new) >= self.max_new_tokens and new[-1] not in self.eos
        return Reply(text=self.tokenizer.decode(new, skip_special_tokens=True), tokens=len(new), cut=cut)

    def close(self) -> None:
        on_cuda = self.device.type == "cuda"
        del self.model
        gc.collect()  # a model spread by accelerate holds itself in a reference cycle
        if on_cuda:
            torch.cuda.empty_cache()
