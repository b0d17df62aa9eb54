"""A sample's header in one byte order: safetensors writes `__metadata__` (the vLLM connector's stamp) in a
random key order on every save; sort_header_metadata makes equal samples equal bytes, tensors untouched."""
from __future__ import annotations

import json
import struct

import torch
from safetensors.torch import load_file, save_file

from workers.stages.extract.output.stable_header import sort_header_metadata

# the four keys workers/vllm_plugins/eagle3web_cpu_connector.server_stamp writes, one of them non-ASCII
STAMP = {"eagle3web_layer_ids": "[2, 4, 5, 8]", "eagle3web_model": "/models/tärget", "eagle3web_hidden_size": "128",
         "eagle3web_num_hidden_layers": "8"}


def _header(path):
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return path.read_bytes()[8:8 + n]


def test_the_same_sample_saved_many_times_is_one_byte_string_once_sorted(tmp_path):
    tensors = {"hidden_states": torch.arange(3 * 2 * 4, dtype=torch.bfloat16).reshape(3, 2, 4),
               "token_ids": torch.tensor([5, 6, 7], dtype=torch.int64)}
    paths = [tmp_path / f"{i}.safetensors" for i in range(12)]
    for path in paths:
        save_file(tensors, str(path), metadata=STAMP)
    as_written = {p.read_bytes() for p in paths}
    assert len(as_written) > 1  # safetensors' own order varies (12 saves, 24 orders): the reason this exists
    sizes = {p.stat().st_size for p in paths}
    changed = [sort_header_metadata(p) for p in paths]
    assert len({p.read_bytes() for p in paths}) == 1 and {p.stat().st_size for p in paths} == sizes
    assert any(changed) and not sort_header_metadata(paths[0])  # a sorted header is left as it is
    header = json.loads(_header(paths[0]))
    assert list(header["__metadata__"]) == sorted(STAMP) and header["__metadata__"] == STAMP
    loaded = load_file(str(paths[0]))
    assert set(loaded) == set(tensors) and all(torch.equal(loaded[k], tensors[k]) for k in tensors)


def test_a_file_without_metadata_is_left_byte_for_byte(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"token_ids": torch.tensor([1, 2], dtype=torch.int64)}, str(path))
    before = path.read_bytes()
    assert sort_header_metadata(path) is False and path.read_bytes() == before
