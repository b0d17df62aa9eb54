"""One sample file of an extraction (`hs_{i}.safetensors` or `data_{i}.pt`): what it holds.

Headers are read without torch (`tensor_headers`), so the web tier can import and re-check an
extraction; a safetensors file's values (token ids, the NaN/inf scan of full mode) are read
without torch too. Torch is imported only for a `.pt` file's values, or where a `.pt` file is
outside what the header reader knows. A `.pt` is a pickle: torch only ever loads it with
`weights_only=True`, which refuses code.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workers.contract.extraction.dtypes import ST_DTYPES
from workers.contract.extraction.tensor_headers import (
    HeaderError,
    TensorMeta,
    read_pt_header,
    read_safetensors_header,
    read_safetensors_ints,
    safetensors_all_finite,
)


@dataclass
class SampleInfo:
    index: int
    path: Path
    nbytes: int
    tokens: int | None = None
    layers: int | None = None
    width: int | None = None
    dtype: str | None = None
    ids_len: int | None = None
    token_ids: list[int] | None = None
    finite: bool | None = None
    error: str | None = None


def read_sample(index: int, path: Path, *, want_ids: bool, full: bool) -> SampleInfo:
    info = SampleInfo(index=index, path=path, nbytes=path.stat().st_size)
    try:
        if path.suffix == ".safetensors":
            _read_safetensors(info, want_ids=want_ids, full=full)
        else:
            _read_pt(info, want_ids=want_ids, full=full)
    except Exception as exc:  # noqa: BLE001 - any failure to read is a finding, not a crash
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            msg = "refused: its pickle would run code or build non-tensor objects (loaded with weights_only=True)"
        info.error = f"{path.name}: {msg}"
    return info


def _read_safetensors(info: SampleInfo, *, want_ids: bool, full: bool) -> None:
    header = read_safetensors_header(info.path)
    keys = set(header.tensors)
    if "hidden_states" not in keys or "token_ids" not in keys:
        raise ValueError(f"needs token_ids and hidden_states, has {sorted(keys)}")
    hs = header.tensors["hidden_states"]
    if len(hs.shape) != 3:
        raise ValueError(f"hidden_states has shape {list(hs.shape)}, expected [T, L, H]")
    info.tokens, info.layers, info.width = hs.shape
    info.dtype = ST_DTYPES.get(hs.dtype, hs.dtype)
    ids = header.tensors["token_ids"]
    info.ids_len = ids.shape[0]
    if want_ids:
        info.token_ids = read_safetensors_ints(info.path, header, "token_ids")
    if full:
        info.finite = safetensors_all_finite(info.path, header, "hidden_states")
    if (full and info.finite is None) or (want_ids and info.token_ids is None):
        from safetensors import safe_open

        with safe_open(str(info.path), framework="pt") as f:
            if want_ids and info.token_ids is None:
                info.token_ids = f.get_tensor("token_ids").tolist()
            if full and info.finite is None:
                info.finite = _all_finite([f.get_tensor("hidden_states")])


def _read_pt(info: SampleInfo, *, want_ids: bool, full: bool) -> None:
    if not (want_ids or full):
        try:
            obj = read_pt_header(info.path)
        except HeaderError:
            raise
        except Exception:  # noqa: BLE001 - NeedsTorch, or a pickle the header reader cannot follow: torch judges
            obj = None
        if obj is not None:
            _pt_shapes(info, obj, TensorMeta)
            return
    obj = _torch_load(info.path)
    import torch

    _pt_shapes(info, obj, torch.Tensor)
    hs, ids = obj["hidden_states"], obj.get("input_ids", obj.get("token_ids"))
    if want_ids and ids is not None:
        info.token_ids = ids.tolist()
    if full:
        info.finite = _all_finite(list(hs) if isinstance(hs, (list, tuple)) else [hs])


def _pt_shapes(info: SampleInfo, obj, tensor_type: type) -> None:
    """Shapes and dtype from torch.save's dict, whose tensors are torch's or TensorMeta."""
    if not isinstance(obj, dict) or "hidden_states" not in obj:
        raise ValueError("expected a dict with hidden_states")
    hs, ids = obj["hidden_states"], obj.get("input_ids", obj.get("token_ids"))
    if isinstance(hs, (list, tuple)):
        shapes = [tuple(t.shape) if isinstance(t, tensor_type) else None for t in hs]
        dtype = hs[0].dtype if hs and isinstance(hs[0], tensor_type) else None
    elif isinstance(hs, tensor_type) and hs.dim() == 3:
        shapes, dtype = [(hs.shape[0], hs.shape[2])] * hs.shape[1], hs.dtype
    else:
        shapes, dtype = [None], None
    if not shapes or any(s is None or len(s) != 2 or s != shapes[0] for s in shapes):
        raise ValueError("hidden_states must be L tensors of one shape [T, H] or one [T, L, H]")
    (info.tokens, info.width), info.layers = shapes[0], len(shapes)
    info.dtype = str(dtype).removeprefix("torch.")
    info.ids_len = None if ids is None else int(ids.shape[0])


def _torch_load(path: Path):
    import torch

    try:
        return torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise
        return torch.load(str(path), map_location="cpu", weights_only=True)  # legacy, non-zip .pt


def _all_finite(tensors) -> bool:
    import torch

    return all(bool(torch.isfinite(t.float()).all()) for t in tensors)
