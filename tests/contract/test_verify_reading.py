"""Verifying an extraction reads its files as the formats define them: safetensors and .pt headers without
torch (agreeing with torch where torch would load them), pickles refused unrun, fp8 with its scales, and the
floor of bytes a token takes in each stored dtype. The layouts, manifests and counts: test_verify.py."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.contract.test_verify import H, L, LENGTHS, _fail, _sample, flat_manifest, write_09, write_flat, write_v04
from tests.contract.test_verify import target  # noqa: F401 - the fixture: a target config of H and N
from workers.contract.extraction.dtypes import floor_bytes_per_token
from workers.contract.extraction.verify import verify_extraction


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_malicious_pickle_is_refused_without_running(tmp_path, target):
    root = write_v04(tmp_path / "x")
    marker = tmp_path / "pwned"
    torch.save({"input_ids": torch.zeros(7, dtype=torch.long), "hidden_states": _Exploit(marker)}, root / "data_3.pt")
    report = verify_extraction(root, target_dir=target, full=True)
    check = _fail(report, "readable")
    assert not marker.exists()
    torch.load(root / "data_3.pt", weights_only=False)  # the exploit is real: an unsafe load runs it
    assert marker.exists()
    assert check.offending_files == ["data_3.pt"] and "data_3.pt: refused" in check.message
    assert "weights_only=True" in check.message


def test_fp8_variant_passes_and_wrong_claimed_dtype_fails(tmp_path, target):
    root = tmp_path / "x"
    (root / "hidden_states").mkdir(parents=True)
    for i, t in enumerate(LENGTHS):
        ids, hs = _sample(i, t)
        save_file({"token_ids": ids, "hidden_states": hs.to(torch.float8_e4m3fn),
                   "hidden_states_scales": torch.ones(t, 1, 1)}, str(root / "hidden_states" / f"hs_{i}.safetensors"))
    report = verify_extraction(root, target_dir=target, full=True)
    assert report.passed and report.check("dtype").claimed == "float8_e4m3fn"
    (root / "data_config.json").write_text(json.dumps(flat_manifest(dtype="bfloat16")))
    check = _fail(verify_extraction(root, target_dir=target), "dtype")
    assert "hs_0.safetensors: dtype float8_e4m3fn" in check.message


def test_floor_bytes_per_token_counts_the_stored_dtype():
    assert floor_bytes_per_token(L, H, "bfloat16") == floor_bytes_per_token(L, H, "float16") == L * H * 2
    assert floor_bytes_per_token(L, H, "float32") == L * H * 4
    # fp8: one byte per element plus speculators' float32 hidden_states_scales [T, 1, 1]
    assert floor_bytes_per_token(L, H, "float8_e4m3fn") == floor_bytes_per_token(L, H, "float8_e5m2") == L * H + 4
    assert floor_bytes_per_token(L, H, "complex32") is None and floor_bytes_per_token(0, H, "bfloat16") is None


def test_fp8_floor_is_one_byte_per_value_plus_the_scale(tmp_path, target):
    root = tmp_path / "x"
    (root / "hidden_states").mkdir(parents=True)
    ids, hs = _sample(0, 6)
    save_file({"token_ids": ids, "hidden_states": hs.to(torch.float8_e4m3fn), "hidden_states_scales": torch.ones(6, 1, 1)},
              str(root / "hidden_states" / "hs_0.safetensors"))
    report = verify_extraction(root, target_dir=target)
    assert report.floor_bytes_per_token == L * H + 4 <= report.bytes_per_token


@pytest.mark.parametrize("corrupt", ["padded", "unknown dtype", "offsets past the data"])
def test_safetensors_headers_are_checked_as_safetensors_checks_them(tmp_path, target, corrupt):
    from safetensors import safe_open

    root = write_09(tmp_path / "x")
    path = root / "hidden_states" / "hs_1.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    if corrupt == "padded":
        raw += b"\0"
    else:
        if corrupt == "unknown dtype":
            header["hidden_states"]["dtype"] = "BF17"
        else:
            header["hidden_states"]["data_offsets"][1] += 2
        text = json.dumps(header).encode()
        raw = len(text).to_bytes(8, "little") + text + raw[8 + n:]
    path.write_bytes(raw)
    with pytest.raises(Exception):
        safe_open(str(path), framework="pt")
    assert _fail(verify_extraction(root, target_dir=target), "readable").offending_files == ["hs_1.safetensors"]


PT_OBJECTS = {
    "layer list": lambda ids, hs: {"input_ids": ids, "hidden_states": [hs[:, k].contiguous() for k in range(L)]},
    "one [T, L, H]": lambda ids, hs: {"token_ids": ids.int(), "hidden_states": hs.float()},
    "views of one storage": lambda ids, hs: {"input_ids": ids, "hidden_states": list(hs.half().unbind(1))},
    "fp8": lambda ids, hs: {"input_ids": ids, "hidden_states": hs.to(torch.float8_e4m3fn)},
    "parameter (torch judges)": lambda ids, hs: {"input_ids": ids, "hidden_states": torch.nn.Parameter(hs.float())},
}


@pytest.mark.parametrize("kind", sorted(PT_OBJECTS))
def test_pt_headers_read_without_torch_agree_with_torch_load(tmp_path, kind, monkeypatch):
    from workers.contract.extraction import samples as extraction_samples
    from workers.contract.extraction.tensor_headers import NeedsTorch

    path = tmp_path / "data_0.pt"
    torch.save(PT_OBJECTS[kind](*_sample(0, 5)), path)
    mine = extraction_samples.read_sample(0, path, want_ids=False, full=False)

    def refuse(_):
        raise NeedsTorch("test")

    monkeypatch.setattr(extraction_samples, "read_pt_header", refuse)
    theirs = extraction_samples.read_sample(0, path, want_ids=False, full=False)
    assert mine.error is None and mine == theirs


def test_a_pt_storage_shorter_than_its_tensor_is_unreadable(tmp_path, target):
    import zipfile

    root = write_v04(tmp_path / "x")
    path = root / "data_2.pt"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp_path / "cut.pt", "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data[:-2] if info.filename.endswith("/data/1") else data)
    path.write_bytes((tmp_path / "cut.pt").read_bytes())
    check = _fail(verify_extraction(root, target_dir=target), "readable")
    assert check.offending_files == ["data_2.pt"] and "data/1" in check.message


def test_header_and_token_checks_never_import_torch(tmp_path, target):
    """What the web tier runs (import, "Verify now", a run's rows token by token, the NaN scan of
    safetensors files) in a fresh interpreter: torch stays out."""
    import subprocess
    import sys

    from datasets import Dataset

    rows = Dataset.from_dict({"input_ids": [_sample(i, t)[0].tolist() for i, t in enumerate(LENGTHS)]})
    rows.set_format("torch")
    rows.save_to_disk(str(tmp_path / "prep"))
    dirs = [str(write_09(tmp_path / "a")), str(write_flat(tmp_path / "b")), str(write_v04(tmp_path / "c"))]
    script = (
        "import json, sys\nfrom pathlib import Path\nfrom workers.contract.extraction.verify import verify_extraction\n"
        f"dirs, target, prep = {dirs!r}, Path({str(target)!r}), Path({str(tmp_path / 'prep')!r})\n"
        "passed = [verify_extraction(Path(d), target_dir=target).passed for d in dirs]\n"
        "passed += [verify_extraction(Path(d), target_dir=target, prepared_dir=prep, full=True).passed for d in dirs[:2]]\n"
        "print(json.dumps({'passed': passed, 'torch': 'torch' in sys.modules, 'datasets': 'datasets' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    assert json.loads(out) == {"passed": [True] * 5, "torch": False, "datasets": False}
