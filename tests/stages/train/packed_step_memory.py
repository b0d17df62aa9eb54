"""One training step through the CPU twin in a fresh process; prints its peak resident memory above
the process's before the step (tests/stages/train/test_packed_step.py runs it per size).

    python tests/stages/train/packed_step_memory.py '{"target_dir": ..., ...}' TOKENS
"""
import ctypes
import gc
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402

torch.set_num_threads(1)


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def return_freed_memory() -> None:
    """glibc keeps freed heap for reuse, which hides a step's allocations from the resident size;
    the caller also sets MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ so that big blocks go back."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets the peak resident size (VmHWM) to the current one."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    from tests.stages.train.test_packed_step import TTT, packed_batch
    from workers.contract.target import read_target_config
    from workers.stages.train.draft.model import build_draft_model
    from workers.stages.train.step.packed_step import draft_forward, kl_loss_config, use_packed_attention

    kwargs = json.loads(sys.argv[1])
    tokens = int(sys.argv[2])
    for key in ("target_dir", "d2t_path", "t2d_path"):
        kwargs[key] = Path(kwargs[key])
    target = read_target_config(kwargs["target_dir"])
    model = build_draft_model(**kwargs, seed=0)
    use_packed_attention(model)
    loss_config, _ = kl_loss_config(torch.device("cpu"))
    warm = packed_batch(target, [256], seed=9)
    draft_forward(model, **warm, ttt_steps=TTT, loss_config=loss_config, attention="document")[1].backward()
    model.zero_grad(set_to_none=True)
    batch = packed_batch(target, [256] * (tokens // 256), seed=1)
    del warm
    gc.collect()
    return_freed_memory()
    reset_peak()
    before = status_bytes("VmRSS")
    _tokens, loss, _metrics = draft_forward(model, **batch, ttt_steps=TTT, loss_config=loss_config,
                                            attention="document")
    loss.backward()
    peak = status_bytes("VmHWM")
    print(json.dumps({"tokens": tokens, "step_peak_bytes": peak - before, "rss_before_bytes": before}))


if __name__ == "__main__":
    main()
