"""Element types of stored hidden states, by name, and what a token must cost on disk.

Pure: no torch. Names are torch's (`bfloat16`, `float8_e4m3fn`); safetensors headers spell them
`BF16`, `F8_E4M3`, and `ST_DTYPES` translates.
"""
from __future__ import annotations

# torch dtype name -> bytes per element
DTYPE_BYTES = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
}
FP8_DTYPES = frozenset({"float8_e4m3fn", "float8_e5m2"})
# speculators' fp8 files store `hidden_states_scales`, float32 [T, 1, 1]: one scale per token.
FP8_SCALE_BYTES_PER_TOKEN = 4

# safetensors dtype names -> torch names, for reports people read.
ST_DTYPES = {
    "F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
}


def floor_bytes_per_token(num_layers: int, hidden_size: int, dtype: str) -> int | None:
    """Bytes per token no file layout can beat: L x H elements of the stored dtype, plus fp8's
    per-token float32 scale. None when a count is missing or the dtype is not one we know."""
    width = DTYPE_BYTES.get(dtype)
    if not num_layers or not hidden_size or width is None:
        return None
    scale = FP8_SCALE_BYTES_PER_TOKEN if dtype in FP8_DTYPES else 0
    return num_layers * hidden_size * width + scale
