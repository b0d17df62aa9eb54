"""vLLM's hidden-states connector for hosts without an accelerator (vLLM's CPU build).

vLLM loads this module inside `vllm serve` (kv_transfer_config's `kv_connector_module_path`), with
this folder on its PYTHONPATH; it imports vLLM only, never eagle3web. The stock
ExampleHiddenStatesConnector copies each finished request's hidden states into pinned host memory
on a CUDA stream, which fails on a CPU host ("pin_memory=True requires a CUDA or other accelerator
backend"). Here the cache already lives in host memory, so a plain copy is the whole transfer; the
lock file, the writer threads and the file layout are the parent's, unchanged, so clients and
speculators' checks read the same files either way.

Both builds' servers use StampedHiddenStatesConnector (the CPU one through its subclass): each file's
safetensors header names the layer ids, the model and its widths the server captured with, so a
trainer that reads files a running server wrote (an online run's capture servers, given by URL) can
refuse a server started for another target or other layers; the tensors are unchanged.
"""
from __future__ import annotations

import fcntl
import json
import os
from functools import partial

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

STAMP_PREFIX = "eagle3web_"  # the header keys; workers.stages.train.online.capture reads them


class _Copied:
    """Stands where the parent keeps a CUDA event for its device-to-host copy: on the CPU the copy is
    finished before the write is submitted, so there is nothing to wait for."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def server_stamp(vllm_config) -> dict[str, str]:
    """What this server captures: layer ids, model, hidden size, layer count (header strings)."""
    hf = vllm_config.model_config.hf_config
    text = getattr(hf, "text_config", None) or hf
    spec = vllm_config.speculative_config.draft_model_config.hf_config
    return {
        f"{STAMP_PREFIX}layer_ids": json.dumps(list(getattr(spec, "eagle_aux_hidden_state_layer_ids", []))),
        f"{STAMP_PREFIX}model": str(vllm_config.model_config.model),
        f"{STAMP_PREFIX}hidden_size": str(getattr(text, "hidden_size", "")),
        f"{STAMP_PREFIX}num_hidden_layers": str(getattr(text, "num_hidden_layers", "")),
    }


class StampedHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector whose files carry server_stamp() in their safetensors header."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._stamp = server_stamp(vllm_config)

    def _write_tensors(self, tensors, event, filename: str, lock_fd: int | None) -> None:
        """The parent's writer (a static method it calls through self), with the stamp in the header."""
        try:
            event.synchronize()
            save_file(tensors, filename, metadata=self._stamp)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX


class CpuHiddenStatesConnector(StampedHiddenStatesConnector):
    """ExampleHiddenStatesConnector whose copy out of the hidden-states cache is a plain clone."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slot_mapping = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        # clone(): the cache blocks are freed and reused once get_finished reports the request.
        hidden_states = extract_from_kv_cache(self._kv_cache, slot_mapping, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}
        if self._req_futures.get(pending.req_id) is not None:
            raise RuntimeError(f"a second hidden-states write for request {pending.req_id}")
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        copied = _Copied()
        future = self._executor.submit(self._write_tensors, tensors, copied, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = copied
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
