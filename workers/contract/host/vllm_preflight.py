"""Does vLLM's own configuration accept a target and an EAGLE-3 draft? Run by vLLM's Python, not ours.

vLLM lives in an environment of its own (workers/contract/host/vllm_env.py), so a launch asks it through a
child process: vLLM's Python runs this file (runpy, from an empty folder) and reads one JSON request
on stdin once vLLM is imported,

    {"target": DIR, "draft": DIR, "num_speculative_tokens": k, "tensor_parallel_size": n, "dtype": "auto"}

where DIR holds the draft's config.json only, and prints one JSON line last on stdout:

    {"ok": true, "vllm": "0.32.0", "seconds": 1.2}
    {"ok": false, "part": "target" | "draft" | "engine", "error": "...", "vllm": ..., "seconds": ...}
    {"ok": null, "why": "..."}   (vLLM failed for a reason other than the configuration)

It builds the configuration `vllm serve DIR --speculative-config '{"method": "eagle3", "model": DRAFT,
"num_speculative_tokens": k}' --tensor-parallel-size n --dtype D` builds (EngineArgs.create_engine_config:
target and draft ModelConfig, SpeculativeConfig, ParallelConfig, VllmConfig) and stops there: no weights
are read, no tokenizer is loaded, no engine or device is started. `part` says whose config vLLM refused:
the target's alone (built first, on its own), the draft's (raised inside SpeculativeConfig, which builds
the draft's ModelConfig), or the whole engine's (tensor parallelism, scheduler limits).

Only the standard library and vLLM: this file is copied nowhere and imports nothing of the project.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

# The draft's config is built inside vllm/config/speculative.py; a frame there means the draft was refused.
_DRAFT_FRAMES = (os.sep + os.path.join("config", "speculative.py"),
                 os.sep + os.path.join("transformers_utils", "configs", "speculators"),
                 os.sep + os.path.join("transformers_utils", "configs", "eagle.py"))
MAX_ERROR_CHARS = 600
# What vLLM's config classes raise when they refuse a value (pydantic's ValidationError is a ValueError);
# anything else (an ImportError, a RuntimeError of its platform) is vLLM failing, not a refusal.
REFUSALS = (ValueError, TypeError, NotImplementedError)


def _part_of(exc: BaseException, default: str) -> str:
    for frame in traceback.extract_tb(exc.__traceback__):
        if any(marker in frame.filename for marker in _DRAFT_FRAMES):
            return "draft"
    # pydantic checks a field's bounds before __post_init__ runs, with no frame of speculative.py.
    return "draft" if getattr(exc, "title", None) == "SpeculativeConfig" else default


def _message(exc: BaseException) -> str:
    """What was refused, in one line: pydantic's errors without their input dumps and links."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            parts = [": ".join(p for p in (".".join(str(x) for x in e.get("loc", ())), e.get("msg", "")) if p)
                     for e in errors()]
            text = f"{getattr(exc, 'title', type(exc).__name__)}: " + "; ".join(parts)
        except Exception:  # noqa: BLE001 - not pydantic's after all
            text = str(exc)
    else:
        text = str(exc)
    # An unknown architecture's message lists every one vLLM knows (hundreds): the name refused is enough.
    text = text.split(" Supported architectures:")[0]
    return " ".join(text.split())[:MAX_ERROR_CHARS] or type(exc).__name__


def check(request: dict) -> dict:
    from vllm import __version__
    from vllm.engine.arg_utils import EngineArgs

    def engine_args() -> EngineArgs:
        return EngineArgs(
            model=request["target"],
            dtype=request.get("dtype") or "auto",
            tensor_parallel_size=int(request.get("tensor_parallel_size") or 1),
            # The tokenizer is read when the engine starts, not by the config: a config-only target passes.
            skip_tokenizer_init=True,
            speculative_config={"method": "eagle3", "model": request["draft"],
                                "num_speculative_tokens": int(request["num_speculative_tokens"])},
        )

    answer = {"vllm": __version__}
    try:  # the target on its own first, so that a target vLLM cannot serve is blamed on the target
        engine_args().create_model_config()
    except REFUSALS as exc:
        return {**answer, "ok": False, "part": "target", "error": _message(exc)}
    try:
        engine_args().create_engine_config()
    except REFUSALS as exc:
        return {**answer, "ok": False, "part": _part_of(exc, "engine"), "error": _message(exc)}
    return {**answer, "ok": True}


def main() -> int:
    started = time.monotonic()
    # vLLM first, the request after: the parent writes the draft's config.json while this imports.
    import vllm.engine.arg_utils  # noqa: F401

    request = json.loads(sys.stdin.read())
    try:
        answer = check(request)
    except Exception as exc:  # noqa: BLE001 - not a refusal: vLLM itself failed, said as such
        answer = {"ok": None, "why": f"{type(exc).__name__}: {_message(exc)}"}
    answer["seconds"] = round(time.monotonic() - started, 2)
    # vLLM logs to stdout as well: the answer is the last line, and the parent reads that one only.
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
