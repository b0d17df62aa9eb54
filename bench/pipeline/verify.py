"""Benchmark (not a test): verify_extraction against bare file opens over the same files, in one run.

    .venv/bin/python bench/pipeline/verify.py --samples 10000 --json

Writes a speculators 0.9 extraction (hidden_states/hs_{i}.safetensors, small tensors) to a temp
dir, then times header-only `verify_extraction` against a loop that only opens every file with
`safe_open` and reads the hidden_states shape, the least any verifier must do. Full mode (values
scanned) is timed too. A speculators v0.4 `.pt` variant (fewer files: torch.save is slower) times
`verify_extraction` against bare `torch.load(mmap=True, weights_only=True)` of every file. Files
were just written, so every pass reads from the page cache; the order of passes is fixed.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from workers.contract.extraction.verify import verify_extraction  # noqa: E402

H, L, N = 16, 4, 8


def write_target(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "num_hidden_layers": N, "hidden_size": H, "vocab_size": 1000}))
    return root


def lengths(n: int) -> list[int]:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(8, 65, (n,), generator=gen).tolist()


def write_09(root: Path, n: int) -> None:
    hs_dir = root / "hidden_states"
    hs_dir.mkdir(parents=True)
    for i, t in enumerate(lengths(n)):
        save_file({"token_ids": torch.randint(0, 1000, (t,)),
                   "hidden_states": torch.randn(t, L, H).to(torch.bfloat16)}, str(hs_dir / f"hs_{i}.safetensors"))


def write_v04(root: Path, n: int) -> None:
    root.mkdir(parents=True)
    lens = lengths(n)
    for i, t in enumerate(lens):
        hs = torch.randn(t, L, H).to(torch.bfloat16)
        torch.save({"input_ids": torch.randint(0, 1000, (t,)), "hidden_states": [hs[:, k].clone() for k in range(L)],
                    "loss_mask": torch.ones(t, dtype=torch.long)}, root / f"data_{i}.pt")
    (root / "sample_lengths.json").write_text(json.dumps({str(i): t for i, t in enumerate(lens)}))
    (root / "data_config.json").write_text(json.dumps({
        "version": "2.0", "model": {"target_model_path": "/m", "hidden_size": H},
        "data": {"seq_length": 64, "num_samples": n}, "hidden_states": {"layer_ids": [2, 4, 5, 7]}}))


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def open_all_safetensors(root: Path) -> int:
    n = 0
    for path in sorted((root / "hidden_states").glob("hs_*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            f.get_slice("hidden_states").get_shape()
        n += 1
    return n


def load_all_pt(root: Path) -> int:
    n = 0
    for path in sorted(root.glob("data_*.pt")):
        torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10000)
    parser.add_argument("--pt-samples", type=int, default=1000, help="files in the .pt variant (0 to skip)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"samples": args.samples, "tensor_shape": f"[8..64, {L}, {H}] bf16"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        target = write_target(tmp / "target")
        out["write_seconds"], _ = timed(lambda: write_09(tmp / "st", args.samples))
        t_open, n = timed(lambda: open_all_safetensors(tmp / "st"))
        t_verify, report = timed(lambda: verify_extraction(tmp / "st", target_dir=target))
        t_full, full = timed(lambda: verify_extraction(tmp / "st", target_dir=target, full=True))
        assert report.passed and full.passed and n == report.num_files == args.samples
        out.update(open_all_samples_per_s=n / t_open, verify_samples_per_s=n / t_verify,
                   verify_full_samples_per_s=n / t_full, verify_over_open_time=t_verify / t_open,
                   bytes_per_token=report.bytes_per_token, floor_bytes_per_token=report.floor_bytes_per_token)
        if args.pt_samples:
            write_v04(tmp / "pt", args.pt_samples)
            t_load, m = timed(lambda: load_all_pt(tmp / "pt"))
            t_pt, pt_report = timed(lambda: verify_extraction(tmp / "pt", target_dir=target))
            assert pt_report.passed, pt_report.failures
            out.update(pt_samples=m, pt_load_all_samples_per_s=m / t_load, pt_verify_samples_per_s=m / t_pt)
    out = {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:32} {value}")


if __name__ == "__main__":
    main()
