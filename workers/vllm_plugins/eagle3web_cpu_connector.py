"""vLLM's hidden-states connector for hosts without an accelerator (vLLM's CPU build).

vLLM loads this module inside `vllm serve` (kv_transfer_config's `kv_connector_module_path`), with
this folder on its PYTHONPATH; it imports vLLM only, never eagle3web. The stock
ExampleHiddenStatesConnector copies each finished request's hidden states into pinned host memory
on a CUDA stream, which fails on a CPU host ("pin_memory=True requires a CUDA or other accelerator
backend"). Here the cache already lives in host memory, so a plain copy is the whole transfer; the
lock file, the writer threads and the file layout are the parent's, unchanged, so clients and
speculators' checks read the same files either way.
"""
from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Copied:
    """Stands where the parent keeps a CUDA event for its device-to-host copy: on the CPU the copy is
    finished before the write is submitted, so there is nothing to wait for."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
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
