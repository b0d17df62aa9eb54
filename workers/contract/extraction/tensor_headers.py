"""Shapes and dtypes of the tensors in a `.safetensors` or `.pt` file, read without torch.

Pure: no torch; the web tier imports and verifies extractions with it. Values are read only for
a safetensors file's token ids (pure Python) and its NaN/inf scan (numpy, imported there).

- safetensors: 8 bytes little-endian header length, a JSON header `{name: {dtype, shape,
  data_offsets: [begin, end]}}` (plus `__metadata__`), then the data. The header is checked as the
  safetensors library checks it: offsets tile the data from 0 without gap or overlap, each tensor's
  bytes equal its element count times its dtype's width, and the data ends where the file ends.
- `.pt` (torch's zip format): `data.pkl` is unpickled with an allowlist (tensors rebuilt from
  typed storages, OrderedDict) that builds `TensorMeta` instead of tensors, so a pickle that would
  run code is never executed. Each storage must exist in the archive with the bytes its tensors
  address. Anything else (a legacy non-zip file, a global outside the allowlist) raises
  `NeedsTorch`: the caller asks `torch.load(weights_only=True)`, which is the judge of the rest.
"""
from __future__ import annotations

import io
import json
import pickle
import struct
import sys
import zipfile
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from math import prod
from pathlib import Path

from workers.contract.extraction.dtypes import DTYPE_BYTES, ST_DTYPES
from workers.contract.inputs.regular_file import open_regular

ST_MAX_HEADER = 100_000_000  # safetensors' own limit
# every dtype safetensors 0.8 knows, in bits per element
ST_BITS = {name: 8 * DTYPE_BYTES[torch_name] for name, torch_name in ST_DTYPES.items()} | {
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "C64": 64}
ST_ARRAY_CODES = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U64": "Q", "U32": "I", "U16": "H", "U8": "B"}


class HeaderError(ValueError):
    """The file's header is malformed or does not cover the file."""


class NeedsTorch(Exception):
    """This file can only be judged by torch.load(weights_only=True)."""


@dataclass(frozen=True)
class STTensor:
    dtype: str  # safetensors' name, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int  # data offsets, relative to the end of the header
    end: int


@dataclass(frozen=True)
class STHeader:
    tensors: dict[str, STTensor]
    data_start: int  # 8 + header length


def read_safetensors_header(path: Path) -> STHeader:
    with open_regular(path) as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise HeaderError("file is shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > ST_MAX_HEADER:
            raise HeaderError(f"header length {n} exceeds safetensors' limit {ST_MAX_HEADER}")
        raw = fh.read(n)
        size = fh.seek(0, 2)
    if len(raw) < n:
        raise HeaderError(f"header length {n} is past the end of the file ({size} bytes)")
    if not raw.startswith(b"{"):
        raise HeaderError("header does not start with '{'")
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"header is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise HeaderError("header is not a JSON object")
    tensors = {}
    for name, entry in parsed.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not (isinstance(dtype, str) and all(isinstance(v, int) and v >= 0 for v in (*shape, begin, end))):
                raise TypeError
        except (KeyError, TypeError, ValueError):
            raise HeaderError(f"tensor {name!r}: needs dtype, shape and data_offsets [begin, end]") from None
        if dtype not in ST_BITS:
            raise HeaderError(f"tensor {name!r}: unknown dtype {dtype!r}")
        tensors[name] = STTensor(dtype, tuple(shape), begin, end)
    pos = 0
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if t.begin != pos or t.end < t.begin:
            raise HeaderError(f"tensor {name!r}: data_offsets [{t.begin}, {t.end}] leave a gap or overlap at {pos}")
        bits = prod(t.shape) * ST_BITS[t.dtype]
        if bits % 8 or bits // 8 != t.end - t.begin:
            raise HeaderError(f"tensor {name!r}: shape {list(t.shape)} of {t.dtype} needs {bits / 8:g} bytes, "
                              f"data_offsets give {t.end - t.begin}")
        pos = t.end
    if 8 + n + pos != size:
        raise HeaderError(f"header describes {pos} bytes of tensor data, the file holds {size - 8 - n} "
                          "(truncated or padded)")
    return STHeader(tensors, 8 + n)


def read_safetensors_ints(path: Path, header: STHeader, name: str) -> list[int] | None:
    """The values of an integer tensor, flattened; None for a dtype this reader does not decode."""
    t = header.tensors[name]
    code = ST_ARRAY_CODES.get(t.dtype)
    if code is None:
        return None
    values = array(code)
    if values.itemsize * 8 != ST_BITS[t.dtype]:
        return None
    with open_regular(path) as fh:
        fh.seek(header.data_start + t.begin)
        values.frombytes(fh.read(t.end - t.begin))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


# A float is NaN or inf exactly when its exponent bits are all ones (float8_e4m3fn has no inf: its
# NaN is S.1111.111). (numpy dtype of the raw bits, mask, the masked value that means non-finite)
ST_NONFINITE_BITS = {
    "F64": ("<u8", 0x7FF0000000000000, 0x7FF0000000000000), "F32": ("<u4", 0x7F800000, 0x7F800000),
    "BF16": ("<u2", 0x7F80, 0x7F80), "F16": ("<u2", 0x7C00, 0x7C00),
    "F8_E4M3": ("u1", 0x7F, 0x7F), "F8_E5M2": ("u1", 0x7C, 0x7C),
}
ST_INTEGERS = frozenset(ST_ARRAY_CODES) | {"BOOL"}
FINITE_CHUNK_BYTES = 64 << 20


def safetensors_all_finite(path: Path, header: STHeader, name: str) -> bool | None:
    """Whether every value of a tensor is finite, from its bits; None for a dtype not covered here."""
    t = header.tensors[name]
    if t.dtype in ST_INTEGERS:
        return True
    spec = ST_NONFINITE_BITS.get(t.dtype)
    if spec is None:
        return None
    import numpy as np

    code, mask, bad = spec
    width = np.dtype(code).itemsize
    count = (t.end - t.begin) // width
    if count == 0:
        return True
    values = np.memmap(path, dtype=code, mode="r", offset=header.data_start + t.begin, shape=(count,))
    step = max(1, FINITE_CHUNK_BYTES // width)
    try:
        return not any(bool(((values[i:i + step] & mask) == bad).any()) for i in range(0, count, step))
    finally:
        del values


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str  # torch's name, e.g. "bfloat16"

    def dim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class _StorageType:
    dtype: str
    itemsize: int


@dataclass(frozen=True)
class _Storage:
    nbytes: int
    dtype: str
    itemsize: int


# torch.save pickles typed storages by their legacy class names; dtypes without one go through
# UntypedStorage with the dtype as a separate global (_rebuild_tensor_v3).
PT_STORAGES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool",
}


def _rebuild(storage, offset: int, size, stride, dtype: str, itemsize: int) -> TensorMeta:
    if not isinstance(storage, _Storage):
        raise NeedsTorch("tensor without a storage record")
    size, stride = tuple(size), tuple(stride)
    if size and min(size) == 0:
        return TensorMeta(size, dtype)
    needed = (offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1) * itemsize
    if needed > storage.nbytes:
        raise HeaderError(f"a tensor of shape {list(size)} needs {needed} bytes of its storage, "
                          f"which holds {storage.nbytes}")
    return TensorMeta(size, dtype)


def _rebuild_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    if not isinstance(storage, _Storage):
        raise NeedsTorch("tensor without a storage record")
    return _rebuild(storage, offset, size, stride, storage.dtype, storage.itemsize)


def _rebuild_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise NeedsTorch(f"dtype {dtype!r}")
    return _rebuild(storage, offset, size, stride, dtype, DTYPE_BYTES[dtype])


class _HeaderUnpickler(pickle.Unpickler):
    def __init__(self, fh, archive: zipfile.ZipFile, prefix: str, size: int):
        super().__init__(fh)
        self.archive, self.prefix, self.size = archive, prefix, size

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _rebuild_v2 if name.endswith("v2") else _rebuild_v3
        if module == "torch" and name in PT_STORAGES:
            return _StorageType(PT_STORAGES[name], DTYPE_BYTES[PT_STORAGES[name]])
        if (module, name) == ("torch.storage", "UntypedStorage"):
            return _StorageType("uint8", 1)
        if module == "torch" and name in DTYPE_BYTES:
            return name
        raise NeedsTorch(f"Unsupported global: GLOBAL {module}.{name}")

    def _check_record(self, name: str) -> int:
        """The bytes of a stored (uncompressed) record, as torch's mmap reader finds it: its local header
        must name it, and its data must lie inside the file."""
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            raise HeaderError(f"storage record {name} is missing") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise NeedsTorch(f"{name} is compressed")
        fp = self.archive.fp
        fp.seek(info.header_offset)
        local = fp.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise HeaderError(f"storage record {name}: bad local header")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        if fp.read(name_len) != info.orig_filename.encode("utf-8"):
            raise HeaderError(f"storage record {name}: local header names another file")
        if info.header_offset + 30 + name_len + extra_len + info.file_size > self.size:
            raise HeaderError(f"storage record {name} runs past the end of the file")
        return info.file_size

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise NeedsTorch(f"persistent id {pid!r:.80}")
        _, kind, key, _location, numel = pid
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise NeedsTorch(f"persistent id {pid!r:.80}")
        record = f"{self.prefix}/data/{key}"
        held = self._check_record(record)
        nbytes = numel * kind.itemsize
        if held < nbytes:
            raise HeaderError(f"storage record {record} holds {held} bytes, {nbytes} expected")
        return _Storage(nbytes, kind.dtype, kind.itemsize)


def read_pt_header(path: Path):
    """The object torch.save wrote, with every tensor replaced by its TensorMeta."""
    with open_regular(path) as fh:  # is_zipfile would block on a FIFO
        if not zipfile.is_zipfile(fh):
            raise NeedsTorch("not torch's zip format")
    with open_regular(path) as fh, zipfile.ZipFile(fh) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise NeedsTorch("no single data.pkl")
        prefix = pickles[0].rsplit("/", 1)[0]
        names = set(archive.namelist())
        stray = sorted(n for n in names if not n.startswith(prefix + "/"))
        if stray:
            raise HeaderError(f"record {stray[0]!r} is outside the archive's folder {prefix}/")
        for info in archive.infolist():  # what miniz, torch's zip reader, refuses and Python's tolerates
            if info.flag_bits & 0x41 or info.volume or (info.compress_type == zipfile.ZIP_STORED
                                                         and info.compress_size != info.file_size):
                raise HeaderError(f"record {info.filename!r}: corrupt central directory entry (encryption flags, "
                                  "disk number or sizes)")
        if f"{prefix}/version" not in names:
            raise HeaderError("no version record: not an archive torch.save wrote")
        # the small records torch reads: reading checks their local headers and checksums
        small = {n: archive.read(f"{prefix}/{n}").decode("utf-8").strip()
                 for n in ("version", ".format_version", ".storage_alignment", "byteorder", ".data/serialization_id")
                 if f"{prefix}/{n}" in names}
        if not small["version"].isdigit():
            raise HeaderError(f"version record {small['version'][:20]!r} is not a number")
        if small.get("byteorder", "little") != "little":
            raise NeedsTorch("big-endian archive")
        data = archive.read(pickles[0])
        size = Path(path).stat().st_size
        return _HeaderUnpickler(io.BytesIO(data), archive, prefix, size).load()
