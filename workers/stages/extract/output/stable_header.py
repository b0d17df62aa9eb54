"""One byte sequence for one sample: a safetensors file's `__metadata__` keys put in sorted order.

Why: safetensors (0.8, its Rust serializer) keeps a file's metadata in a HashMap with a random seed, so
the same tensors and the same metadata come out with the keys in a different order on every save, even
twice in one process. vLLM's hidden-states connector (workers/vllm_plugins/eagle3web_cpu_connector.py)
stamps each file with four such keys, so without this two extractions of the same rows (one worker, or
two shards) wrote equal tensors under headers that differed. The tensors' own entries are already in a
fixed order (safetensors sorts them by dtype, then name); only the metadata needs sorting.

Pure (no torch): the header is rewritten in place, the same length (same keys, same values, padded with
spaces as safetensors pads), so the data and its offsets are untouched.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

METADATA = "__metadata__"


def sort_header_metadata(path: Path) -> bool:
    """Rewrite `path`'s header with its metadata keys sorted; True if that changed a byte."""
    with open(path, "r+b") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        raw = fh.read(length)
        header = json.loads(raw)
        metadata = header.get(METADATA)
        if not isinstance(metadata, dict) or len(metadata) < 2:
            return False
        ordered = {METADATA: dict(sorted(metadata.items()))}
        ordered.update((k, v) for k, v in header.items() if k != METADATA)
        # safetensors' own form: compact JSON, UTF-8 unescaped, so the same content has the same length
        encoded = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(encoded) > length:
            raise ValueError(f"{path}: its safetensors header ({length} bytes) was not written in "
                             f"safetensors' compact form; sorted, it needs {len(encoded)}")
        padded = encoded + b" " * (length - len(encoded))
        if padded == raw:
            return False
        fh.seek(8)
        fh.write(padded)
        return True
