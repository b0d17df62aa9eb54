"""An online run end to end, as a user launches it: `run_pipeline --hidden-states online --capture-servers 1`
on the demo target with vLLM's CPU build, inline. The train stage starts its own capture server; the run
ends with checkpoints, no extraction, a cache folder that never held more than its limit (sampled from
disk every 20 ms while the run runs, the capture server's files included), and its supply figures in the
summary the run page and the API show."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from bench.pipeline.online import FolderPeak
from runs.pipeline.online.selectors import CACHE_DIRNAME
from tests.helpers.vllm_here import vllm_or_skip

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

CACHE_GIB = 0.001  # 1,073,741 bytes: about two thirds of this run's hidden states (checked below)


def _cli(name: str, *args) -> dict:
    out = io.StringIO()
    call_command(name, *args, "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_an_online_run_trains_to_checkpoints_with_no_extraction_and_its_supply_shown(tiny_target, tmp_path,
                                                                                     settings):
    vllm_or_skip()
    settings.EAGLE3WEB_DATA_ROOTS = [tmp_path.resolve(), Path(tiny_target.target_dir).parent.resolve()]
    settings.EAGLE3WEB_RUNS_DIR = tmp_path / "runs"
    # The run's cache folder measured from disk, as a user would (its servers' staging files included).
    sampler = FolderPeak(settings.EAGLE3WEB_RUNS_DIR, pattern=f"*/{CACHE_DIRNAME}/**/*.safetensors*")
    sampler.start()
    try:
        summary = _cli("run_pipeline", "--target", str(tiny_target.target_dir),
                       "--dataset", str(tiny_target.chats_path), "--max-samples", "40", "--max-seq-len", "256",
                       "--draft-vocab-size", "256", "--epochs", "3", "--val-fraction", "0.2", "--eval-prompts", "4",
                       "--eval-max-new-tokens", "16", "--hidden-states", "online", "--capture-servers", "1",
                       "--hidden-states-cache-gib", str(CACHE_GIB), "--inline")
    finally:
        sampler.done.set()
        sampler.join()
    assert [st["status"] for st in summary["stages"]] == ["succeeded"] * 5, summary["stages"]
    assert len(summary["checkpoints"]) == 3 and all(Path(c["path"]).is_dir() for c in summary["checkpoints"])
    run_dir = Path(summary["output_dir"])
    assert not list(run_dir.glob("extraction/hidden_states/hs_*.safetensors"))  # nothing extracted
    supply = summary["supply"]
    limit = int(CACHE_GIB * 1024**3)
    assert supply["hidden_states"] == "online"
    assert 0 < supply["peak_cache_bytes"] <= limit
    print(f"cache folder on disk, sampled: peak {sampler.peak:,} bytes; the run's peak_cache_bytes "
          f"{supply['peak_cache_bytes']:,}; limit {limit:,}")
    assert 0 < sampler.peak <= supply["peak_cache_bytes"], (sampler.peak, supply["peak_cache_bytes"], limit)
    assert len(supply["served_by"]) == 1 and sum(supply["served_by"].values()) > 0
    assert supply["capture_tokens_per_s"] > 0 and supply["advice"]
    # More rows were captured than the cache could hold at once: the limit was real.
    tokens = sum(v["tokens"] for v in json.loads((run_dir / "hidden_states_cache" / "served.json").read_text())
                 ["samples"].values())
    assert tokens * 4 * 128 * 2 > limit
    extract = next(st for st in summary["stages"] if st["name"] == "extract")
    assert "online: hidden states are captured during training" in json.dumps(extract)
