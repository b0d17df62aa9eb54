"""Checks a launch makes before anything is stored and before a GPU is spent (runs.pipeline.services.run_launch).

What the stages would otherwise find out hours in:
* the tokenizer: every id it can produce must index the target's embedding (config.json vocab_size),
  or the vocab stage (workers/stages/vocab.py) refuses token_freq.pt, and d2t/t2d cannot be built, after
  prepare and extraction ran. Read from tokenizer.json with the standard library, no model loaded.
* vLLM: where this host has it (workers/contract/host/vllm_env.py), its own config classes are asked whether
  they take the target and the draft this run will train, as `vllm serve TARGET --speculative-config
  '{"method": "eagle3", "model": DRAFT, "num_speculative_tokens": k}'` builds them, with the draft's
  config.json written the way training writes it (workers/stages/train/draft/config.py) and no weights.

(Layer ids, distinct and inside the target, and draft_vocab_size no larger than the target's vocabulary,
are checked by run_launch itself, before these.)

vLLM lives in an environment of its own, so the question goes to a child process run by vLLM's Python
(workers/contract/host/vllm_preflight.py), and the draft's config is written by a child of ours (the web tier
imports no torch nor speculators); they cost their imports of vLLM and torch, seconds, so the check is
only asked where vLLM is installed, within EAGLE3WEB_VLLM_PREFLIGHT_SECONDS, and each answer is kept for
the process's later launches of the same target and draft (a sweep's runs, say). What the check found
goes into the run's config under VLLM_CHECK_KEY, so the run page, the API and run_pipeline --json show
it, "skipped: ..." included.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

from django.conf import settings

from eagle3web.env import env_int
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from workers.contract.inputs.regular_file import open_regular
from workers.contract.host.vllm_env import VllmInstall, _interpreter, vllm_install

logger = logging.getLogger(__name__)

VLLM_CHECK_KEY = "vllm_check"
SECONDS_SETTING = "EAGLE3WEB_VLLM_PREFLIGHT_SECONDS"  # a Django setting, else the environment; 0 turns it off
DEFAULT_SECONDS = 60
ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "workers" / "contract" / "host" / "vllm_preflight.py"
# tokenizer.json of the largest public vocabularies (~260k tokens) is ~35 MB; a larger file is not read.
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
MAX_CACHED = 256


def preflight_seconds() -> int:
    value = getattr(settings, SECONDS_SETTING, None)
    return int(value) if value is not None else env_int(SECONDS_SETTING, DEFAULT_SECONDS)


# --- the tokenizer against the target's vocabulary --------------------------------------------------------

def tokenizer_top_id(target_dir: Path) -> tuple[int, str] | None:
    """(highest id, its token) of the target's tokenizer.json, or None where there is none to read
    (sentencepiece only, too large, unreadable: prepare loads the tokenizer and says what is wrong)."""
    path = Path(target_dir) / "tokenizer.json"
    try:
        stat = path.stat()
    except OSError:
        return None
    # Parsing a 260k-token tokenizer.json takes ~0.6 s: once per file as it is, not once per run of a sweep.
    return _tokenizer_top_id(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _tokenizer_top_id(path: str, size: int, mtime_ns: int) -> tuple[int, str] | None:
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_TOKENIZER_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_TOKENIZER_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    ids: list[tuple[int, str]] = []
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        ids += [(i, t) for t, i in vocab.items() if isinstance(i, int)]
    elif isinstance(vocab, list) and vocab:  # Unigram: [token, score] pairs, the id is the position
        last = vocab[-1]
        ids.append((len(vocab) - 1, str(last[0]) if isinstance(last, list) and last else "?"))
    for token in data.get("added_tokens") or []:
        if isinstance(token, dict) and isinstance(token.get("id"), int):
            ids.append((token["id"], str(token.get("content", "?"))))
    return max(ids) if ids else None


def check_tokenizer_ids(target_dir: Path, vocab_size: int) -> None:
    found = tokenizer_top_id(target_dir)
    if found is not None and found[0] >= vocab_size:
        top, token = found
        raise RunConfigError(
            f"{Path(target_dir) / 'tokenizer.json'}: token {token[:40]!r} has id {top}, outside the target's "
            f"vocabulary of {vocab_size} (config.json vocab_size): data prepared with this tokenizer cannot be "
            "embedded by the target nor mapped to a draft vocabulary (d2t/t2d); give the tokenizer that belongs "
            "to this model", field="target_path")


# --- vLLM's answer ------------------------------------------------------------------------------------------

_answers: OrderedDict[str, dict] = OrderedDict()
_answers_lock = threading.Lock()


def cache_clear() -> None:
    with _answers_lock:
        _answers.clear()


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "-"


def _spawn(command: list[str], *, cwd: Path | str) -> subprocess.Popen:
    # Its own session, so that ending it on a timeout ends the helpers it started too.
    return subprocess.Popen(command, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})


def _end(proc: subprocess.Popen) -> None:
    """The child and what it started gone, its pipes closed and its exit collected."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.communicate()
    except (ValueError, OSError):  # its pipes were closed by an earlier communicate
        proc.wait()


def _answer_of(proc: subprocess.Popen, request: dict, *, deadline: float, who: str) -> dict:
    """The child's last JSON line once it read `request`; TimeoutExpired past the deadline."""
    out, err = proc.communicate(json.dumps(request), timeout=max(0.1, deadline - time.monotonic()))
    lines = [line for line in out.splitlines() if line.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " ".join((err or "").strip().splitlines()[-3:])[-300:]
        return {"ok": None, "why": f"{who} ended without an answer (exit {proc.returncode}): {tail}"}


def _ask_vllm(install: VllmInstall, *, request: dict, draft_request: dict, timeout_s: float) -> dict:
    """vLLM's answer, or {"ok": None, "why": ...} when it gave none in time. Two children at once: vLLM's
    Python imports vLLM (most of the time) while ours writes the draft's config.json with speculators."""
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="eagle3web-preflight-") as tmp:
        draft_dir = Path(tmp) / "draft"
        # The script runs by path (runpy) from the empty temp folder, so that nothing of this project
        # shadows a module vLLM imports.
        checker = _spawn([_interpreter(install.executable), "-c",
                          "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')", str(SCRIPT)], cwd=tmp)
        writer = _spawn([sys.executable, "-m", "workers.stages.train.draft.config"], cwd=ROOT)
        try:
            wrote = _answer_of(writer, {**draft_request, "out_dir": str(draft_dir)}, deadline=deadline,
                               who="the draft's config writer")
            if wrote.get("ok") is not True:
                why = wrote.get("error") or wrote.get("why")
                return {"ok": None, "why": f"speculators could not write the draft's config.json ({why})"}
            answer = _answer_of(checker, {**request, "draft": str(draft_dir)}, deadline=deadline, who="vLLM's check")
        except subprocess.TimeoutExpired:
            return {"ok": None, "why": f"vLLM's check took longer than {timeout_s:g} s"}
        finally:
            _end(writer)
            _end(checker)
    return answer


# Which of the run's settings a refusal of vLLM's is about, by what its message names; a refusal of the
# target alone, or of anything else in the draft (whose shape is the target's), blames the target.
_BLAMES = (("tensor parallel", "tensor_parallel_size"), ("tensor_parallel", "tensor_parallel_size"),
           ("num_speculative_tokens", "ttt_steps"), ("vocab", "draft_vocab_size"),
           ("layer_ids", "layer_ids"), ("aux_hidden_state", "layer_ids"))
_WHOSE = {"target": "the target", "draft": "the draft this run would train", "engine": "this target with its draft"}


def blamed_field(answer: dict) -> str:
    if answer.get("part") == "target":
        return "target_path"
    error = str(answer.get("error", "")).lower()
    return next((field for words, field in _BLAMES if words in error), "target_path")


def vllm_check(*, target_dir: Path, layer_ids: list[int], config: RunConfig) -> str:
    """What vLLM's check found, in words for the run's config; RunConfigError naming the field when its
    config classes refuse the target or the draft."""
    seconds = preflight_seconds()
    if seconds <= 0:
        return f"skipped: turned off ({SECONDS_SETTING}={seconds})"
    install = vllm_install()
    if isinstance(install, str):
        return f"skipped: {install}"
    # Served as the serve check serves it: on the GPUs vLLM extracted on, in the target's own dtype.
    from workers.contract.target import target_dtype

    tp = config.tensor_parallel_size if config.extraction_backend == "vllm" else 1
    request = {"target": str(target_dir), "num_speculative_tokens": config.ttt_steps, "tensor_parallel_size": tp,
               "dtype": target_dtype(target_dir)}
    aux = list(layer_ids[:-1])  # the last id is the target's final hidden state, which speculators adds itself
    # The answer depends on what vLLM reads of the target (its config.json, generation_config.json) and
    # on the draft's settings, not on where the target lies: copies of a model, and tests, share it.
    key = hashlib.sha256(json.dumps([install.executable, install.version, _file_digest(target_dir / "config.json"),
                                     _file_digest(target_dir / "generation_config.json"), aux,
                                     config.draft_vocab_size, {**request, "target": None}]).encode()).hexdigest()
    with _answers_lock:
        answer = _answers.get(key)
    if answer is None:
        started = time.monotonic()
        answer = _ask_vllm(install, request=request, timeout_s=seconds, draft_request={
            "target": str(target_dir), "aux_layer_ids": aux, "draft_vocab_size": config.draft_vocab_size,
            "ttt_steps": config.ttt_steps})
        logger.info("vLLM's launch check of %s: %s after %.1f s", target_dir,
                    {True: "accepted", False: "refused"}.get(answer.get("ok"), answer.get("why")),
                    time.monotonic() - started)
        if answer.get("ok") is not None:  # a definite answer; a timeout or a failure is asked again next time
            with _answers_lock:
                _answers[key] = answer
                while len(_answers) > MAX_CACHED:
                    _answers.popitem(last=False)
    served = f"method eagle3, {config.ttt_steps} speculative tokens, tensor parallel {tp}"
    if answer.get("ok") is None:
        return f"not run: {answer.get('why')}; the launch went on unchecked"
    version = answer.get("vllm") or install.version
    if not answer["ok"]:
        raise RunConfigError(
            f"vLLM {version} refuses {_WHOSE.get(answer.get('part'), _WHOSE['engine'])} ({served}; its config as "
            f"`vllm serve` builds it, no weights loaded): {answer.get('error')}", field=blamed_field(answer))
    return f"accepted by vLLM {version} ({served}; its config as `vllm serve` builds it, no weights loaded)"


def launch_preflight(*, target_dir: Path, vocab_size: int, layer_ids: list[int], config: RunConfig) -> dict:
    """The run's config entries that say what was checked; RunConfigError naming the field otherwise."""
    check_tokenizer_ids(Path(target_dir), vocab_size)
    return {VLLM_CHECK_KEY: vllm_check(target_dir=Path(target_dir), layer_ids=layer_ids, config=config)}
