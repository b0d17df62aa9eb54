"""Online hidden states (a run's `hidden_states: online`, issue 27) as the web tier sees them: what the
extract stage records instead of an extraction, where the train stage goes and whether a worker takes
it, and the supply figures the run page and the summary show. Reads only; the writes of "keep the
cache" are runs.pipeline.online.services'.

The worker side (starting capture servers, the cache, the measured supply) is
workers.stages.train.online; these read what it leaves: TrainingRun.supply (its SupplyReport) and the
run's cache folder."""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.urls import reverse

from runs.pipeline.models import PipelineRun
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.host.backends import BackendUnavailable, backend_require
from workers.contract.host.backends import stage_queue as backend_queue

CACHE_DIRNAME = "hidden_states_cache"  # <run output_dir>/hidden_states_cache/: the run's bounded cache
KEPT_DIRNAME = "extraction"  # where "keep the cache" writes: the folder an offline run's extraction has
GIB = 1024**3
SAMPLE_FILE = re.compile(r"^hs_(\d+)\.safetensors$")


@dataclass(frozen=True)
class OnlineCaptured:
    """What an online run's extract stage returns: it wrote nothing, training captures (the note says how)."""

    cache_dir: str
    note: str


def is_online(config: dict | None) -> bool:
    return (config or {}).get("hidden_states") == "online"


def run_id_is_online(run_id: int) -> bool:
    return is_online(PipelineRun.objects.filter(pk=run_id).values_list("config", flat=True).first())


def cache_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / CACHE_DIRNAME


def capture_text(config: dict) -> str:
    """"2 capture servers started by the train stage, 1 running at http://h:8000"."""
    started, urls = int(config.get("capture_servers") or 0), list(config.get("capture_urls") or [])
    parts = []
    if started:
        parts.append(f"{started} capture server{'s' if started != 1 else ''} started by the train stage")
    if urls:
        parts.append(f"{len(urls)} running at {', '.join(urls)}")
    return ", ".join(parts) or "no capture server"


def online_note(config: dict) -> str:
    """The extract stage's note for an online run, in place of an extraction's figures."""
    return f"online: hidden states are captured during training ({capture_text(config)}); nothing is extracted here"


def online_extract(*, run: PipelineRun) -> OnlineCaptured:
    """The extract stage of an online run: nothing to compute; the cache folder is made for the vocab
    stage's speculators_data link (runs.pipeline.online.selectors.cache_dir)."""
    folder = cache_dir(run.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return OnlineCaptured(cache_dir=str(folder), note=online_note(run.config or {}))


def train_capture_queue(config: dict) -> str | None:
    """The queue of an online run's train stage when it starts capture servers: vLLM's, on the GPU count a
    vLLM extraction of the run would use (workers.contract.host.backends.stage_queue); None otherwise (its
    training backend's queue, as offline: capture URLs alone need no vLLM on the trainer's worker)."""
    if not is_online(config) or not int(config.get("capture_servers") or 0):
        return None
    try:
        gpus = int(config.get("tensor_parallel_size") or 1)
    except (TypeError, ValueError):
        gpus = 0  # no worker takes vllm.0: the run page says why (runs.pipeline.dispatch.routing.stage_problem)
    return backend_queue(backend="vllm", gpus=gpus)


def online_refusal(*, config: RunConfig, check: str, live: list | None = None) -> tuple[str, str] | None:
    """("capture_servers", why) when an online run would start capture servers where none can run: no live
    worker takes vLLM's queue (check "fleet"), or this host has no vLLM (check "this_host"); None otherwise."""
    queue = train_capture_queue(config.as_dict())
    if queue is None:
        return None
    if check == "this_host":
        try:
            backend_require(name="vllm", gpus=config.tensor_parallel_size)
        except BackendUnavailable as exc:
            return "capture_servers", f"capture_servers {config.capture_servers}: the train stage starts vLLM: {exc}"
        return None
    if not any(queue in (worker.queues or []) for worker in live or []):
        return "capture_servers", (
            f"capture_servers {config.capture_servers}: the train stage starts vLLM capture servers and goes to "
            f"queue {queue}, which no live worker takes; start a worker with vLLM, or give capture_urls of running "
            "servers with capture_servers 0")
    return None


def data_volume_free_bytes() -> int | None:
    """Free bytes on the volume that holds the runs' folders (EAGLE3WEB_RUNS_DIR, or its nearest existing
    parent before the first run made it); None when none can be read. The launch form compares an offline
    extraction's size with it and offers online when it would not fit (static/js/runs/launch.js)."""
    folder = Path(settings.EAGLE3WEB_RUNS_DIR).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def cache_rows_present(*, output_dir: str, num_rows: int) -> int:
    """How many of the prepared rows have a sample file in the run's cache (by name: the worker checks each
    file's header and token ids before keeping it)."""
    folder = cache_dir(output_dir)
    if not folder.is_dir():
        return 0
    return len({int(m.group(1)) for name in (p.name for p in folder.iterdir())
                if (m := SAMPLE_FILE.match(name)) and int(m.group(1)) < num_rows})


def supply_dict(*, run: PipelineRun) -> dict:
    """The run's hidden-state supply for the summary and the run page: the source (offline or online), and
    once the training reported them (workers.stages.train.online.SupplyReport), its figures: the share of
    step time the trainer waited for data, the capture servers' tokens/s, the cache's peak bytes and hit
    rate per epoch, samples per server, supply- or compute-bound and the advice; "keep the cache"'s state."""
    config = run.config or {}
    training = getattr(run, "training_run", None)
    supply = dict(getattr(training, "supply", None) or {})
    online = is_online(config)
    kept = supply.pop("kept", None)
    figures = {key: supply.get(key) for key in (
        "fetch_wait_fraction", "fetch_wait_seconds", "capture_tokens_per_s", "capture_tokens", "capture_seconds",
        "cache_hit_rate_per_epoch", "peak_cache_bytes", "cache_limit_bytes", "evictions", "served_by", "retried",
        "bound", "advice")}
    if online and figures["cache_limit_bytes"] is None:
        figures["cache_limit_bytes"] = int(float(config.get("hidden_states_cache_gib") or 0) * GIB)
    shown = {
        "hidden_states": supply.get("hidden_states") or ("online" if online else "offline"),
        "measured": bool(supply),
        "capture": capture_text(config) if online else None,
        "capture_servers": config.get("capture_servers") if online else None,
        "capture_urls": list(config.get("capture_urls") or []) if online else [],
        "cache_dir": str(cache_dir(run.output_dir)) if online and run.output_dir else None,
        **figures,
        "keep": _keep_state(run=run, online=online, kept=kept),
    }
    shown["rows"] = supply_rows(shown)
    return shown


def _bytes_text(n: int | None) -> str | None:
    """8_700_000 -> "8.7 MB": decimal units, as the launch form's (static/js/runs/launch.js)."""
    if n is None:
        return None
    value, unit = float(n), "bytes"
    for next_unit in ("kB", "MB", "GB", "TB", "PB"):
        if value < 1000:
            break
        value, unit = value / 1000, next_unit
    return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def supply_rows(supply: dict) -> list[dict]:
    """The supply box's lines as text ({key, label, text}; "–" until measured), worded once here for the
    page's first render and its live updates (static/js/runs/supply.js) alike."""
    def text(value, fmt) -> str:
        return "–" if value is None else fmt(value)

    online = supply["hidden_states"] == "online"
    bound = {"supply": "supply-bound: the trainer waited for hidden states",
             "compute": "compute-bound: the hidden states were there when the trainer asked"}
    rows = [
        ("hidden_states", "Hidden states", "online: " + (supply["capture"] or "") if online
         else "offline: the extract stage wrote every sample before training"),
        ("bound", "Bottleneck", bound.get(supply["bound"], "–") if supply["measured"] else "–"),
        ("fetch_wait_fraction", "Trainer waiting for data",
         text(supply["fetch_wait_fraction"], lambda v: f"{100 * v:.1f} % of step time"
              + (f" ({supply['fetch_wait_seconds']:.1f} s)" if supply["fetch_wait_seconds"] is not None else ""))),
    ]
    if online:
        hits = supply["cache_hit_rate_per_epoch"]
        served = supply["served_by"] or {}
        rows += [
            ("capture_tokens_per_s", "Capture servers' tokens/s",
             text(supply["capture_tokens_per_s"], lambda v: f"{v:,.0f} tokens/s (all servers)")),
            ("cache_hit_rate", "Cache hit rate per epoch",
             " · ".join(f"epoch {i + 1}: {100 * r:.0f} %" for i, r in enumerate(hits)) if hits else "–"),
            ("cache_bytes", "Cache on disk, peak / limit",
             f"{_bytes_text(supply['peak_cache_bytes']) or '–'} / {_bytes_text(supply['cache_limit_bytes']) or '–'}"
             + (f" ({supply['evictions']:,} evicted)" if supply["evictions"] else "")),
            ("served_by", "Samples captured by",
             " · ".join(f"{server}: {count:,}" if isinstance(count, int) else f"{server}: {count}"
                        for server, count in served.items()) if served else "–"),
        ]
        if supply["retried"]:
            rows.append(("retried", "Asked again elsewhere", f"{supply['retried']:,} sample(s)"))
    return [{"key": key, "label": label, "text": value} for key, label, value in rows]


def _keep_state(*, run: PipelineRun, online: bool, kept: dict | None) -> dict | None:
    """"Keep the cache": offered once an online run's training succeeded; then its request's state."""
    if not online:
        return None
    training = getattr(run, "training_run", None)
    trained = training is not None and training.status == "succeeded"
    state = dict(kept or {})
    status = state.get("status")
    extraction_id = state.get("extraction_id")
    return {"offered": trained and status in (None, "failed"), "status": status, "extraction_id": extraction_id,
            "url": reverse("runs:extraction_detail", args=[extraction_id]) if extraction_id else None,
            "error": state.get("error") or "", "path": state.get("path")}
