"""vLLM itself (its CPU build, installed by `make vllm`) in the loop: extraction through `vllm serve`
with our CPU-safe connector, and the serve check of a draft trained here.

The serve check is of a draft of the regeneration tests' talker (tests/helpers/regenerate_data.py), trained on
the talker's own replies: the session's tiny_target repeats one token and never reaches its end
token, so any draft that repeats would agree with vLLM there. The talker's replies differ from prompt
to prompt, some end at its end token and some at max_new_tokens, and a draft trained for two epochs
on them reaches a τ well inside (1.2, k + 1 − 0.2), so a τ that both sides count alike can fail.

Where vLLM is not installed these tests skip, saying so; CI sets EAGLE3WEB_REQUIRE_VLLM=1 (after
`make vllm`), so there a missing vLLM fails them instead. Each vLLM start takes one to two minutes on
two cores: one pipeline run extracting with vLLM (one start), the talker's replies (one) and the
talker run's serve check (two) are shared by the tests below."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import time
from pathlib import Path

import psutil
import pytest
import torch
from django.core.management import call_command
from django.utils import timezone
from safetensors.torch import load_file
from tests.helpers.vllm_here import vllm_or_skip
from tests.helpers.worker import started_here

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

MAX_NEW_TOKENS = 48
MAX_PROMPTS = 12
# The talker's replies run 9 to 17 tokens: at 12, some end at its end token and some are cut.
TALKER_MAX_NEW_TOKENS = 12
TALKER_PROMPTS = 16  # fewer than its run holds out, so a row that forgets its count would serve more
TALKER_CONVERSATIONS = 200
# The serve check's load levels (not the default 1, 8, 32, so that the run's setting is seen to reach the check):
# 16 requests each, the talker's prompts once, 16 of them in flight at once at the last level.
TALKER_CONCURRENCY = (1, 4, 16)


@pytest.fixture(scope="module")
def vllm_install():
    return vllm_or_skip()


def _cli(name: str, *args) -> dict:
    out = io.StringIO()
    call_command(name, *args, "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def _rows_removed() -> None:
    from django.contrib.auth import get_user_model

    from runs.models import Checkpoint, Dataset, PipelineRun, StageAttempt, TargetModel

    # The measurement and serve check asked for by `serve_check` are attempts without a run.
    StageAttempt.objects.all().delete()
    Checkpoint.objects.all().delete()
    PipelineRun.objects.all().delete()
    TargetModel.objects.all().delete()
    Dataset.objects.all().delete()
    get_user_model().objects.all().delete()


@pytest.fixture(scope="module")
def vllm_run(vllm_install, tiny_target, django_db_setup, django_db_blocker, tmp_path_factory):
    """`run_pipeline --extraction-backend vllm --inline`, shared; its rows are removed afterwards."""
    from django.test import override_settings

    root = tmp_path_factory.getbasetemp().resolve()
    with django_db_blocker.unblock(), override_settings(EAGLE3WEB_DATA_ROOTS=[root], EAGLE3WEB_RUNS_DIR=root / "vllm-runs"):
        summary = _cli("run_pipeline", "--target", str(tiny_target.target_dir), "--dataset", str(tiny_target.chats_path),
                       "--layer-ids", "2,4,5", "--max-samples", "40", "--max-seq-len", "256", "--draft-vocab-size",
                       "256", "--epochs", "2", "--val-fraction", "0.3", "--extraction-backend", "vllm", "--eval-prompts", str(MAX_PROMPTS),
                       "--eval-max-new-tokens", str(MAX_NEW_TOKENS), "--inline")
        yield summary
        _rows_removed()


@pytest.fixture(scope="module")
def talker_replies(vllm_install, tmp_path_factory):
    """(the talker, a chat file of its own greedy replies to its chats' user turns), answered by vLLM
    (the regenerate stage; its replies equal the transformers backend's, tests/e2e/vllm/test_regenerate_vllm.py)."""
    from tests.helpers.regenerate_data import talking_target
    from workers.stages.regenerate.base import RegenerateSettings
    from workers.stages.regenerate.stage import regenerate

    talker = talking_target(tmp_path_factory.getbasetemp())
    out = tmp_path_factory.mktemp("talker-replies") / "replies.jsonl"
    regenerate(target_dir=talker.target_dir, source_path=talker.chats_path, out_path=out, backend="vllm",
               settings=RegenerateSettings(max_new_tokens=64, max_samples=TALKER_CONVERSATIONS),
               vllm_executable=vllm_install.executable, work_dir=out.parent)
    return talker, out


@pytest.fixture(scope="module")
def talker_run(talker_replies, django_db_setup, django_db_blocker, tmp_path_factory):
    """`run_pipeline --serve-check --inline` of a draft of the talker trained on its replies: the run
    measures our τ on its held-out prompts, then vLLM serves the best checkpoint on them."""
    from django.test import override_settings

    talker, replies = talker_replies
    root = tmp_path_factory.getbasetemp().resolve()
    with django_db_blocker.unblock(), override_settings(EAGLE3WEB_DATA_ROOTS=[root], EAGLE3WEB_RUNS_DIR=root / "talker-runs"):
        summary = _cli("run_pipeline", "--target", str(talker.target_dir), "--dataset", str(replies),
                       "--max-seq-len", "256", "--draft-vocab-size", "512", "--epochs", "2", "--lr", "0.003",
                       "--val-fraction", "0.2", "--eval-prompts", str(TALKER_PROMPTS), "--eval-max-new-tokens",
                       str(TALKER_MAX_NEW_TOKENS), "--serve-check", "--serve-concurrency",
                       ",".join(map(str, TALKER_CONCURRENCY)), "--inline")
        yield summary
        _rows_removed()


def test_inline_run_extracts_with_real_vllm_like_transformers_does(vllm_run, tiny_target, tmp_path):
    from workers.stages.extract.with_transformers import extract
    from workers.contract.extraction.verify import verify_extraction

    assert [s["status"] for s in vllm_run["stages"]] == ["succeeded"] * 5, vllm_run["stages"]
    out = Path(vllm_run["manifest_path"]).parent
    manifest = json.loads((out / "data_config.json").read_text())
    assert manifest["extraction_backend"] == "vllm"
    report = verify_extraction(out, target_dir=tiny_target.target_dir, full=True)
    assert report.passed, report.failures
    prepared = Path(vllm_run["output_dir"]) / "prepared"
    reference = extract(target_dir=tiny_target.target_dir, prepared_dir=prepared, out_dir=tmp_path / "hf",
                        layer_ids=[2, 4, 5, 8], device="cpu")
    files = sorted((out / "hidden_states").glob("hs_*.safetensors"))
    assert len(files) == reference.num_samples > 0
    for path in files:
        ours, theirs = load_file(str(tmp_path / "hf" / "hidden_states" / path.name)), load_file(str(path))
        assert torch.equal(ours["token_ids"], theirs["token_ids"]), path.name
        a, b = ours["hidden_states"].float(), theirs["hidden_states"].float()  # [T, L, H]
        # vLLM computes in bf16 where we compute in float32 and store bf16: within one bf16 step (8 bits
        # of mantissa: 2**-7) of each layer's largest magnitude.
        for layer in range(a.shape[1]):
            diff, scale = (a[:, layer] - b[:, layer]).abs().max().item(), a[:, layer].abs().max().item()
            assert diff <= scale * 2 ** -7, f"{path.name} layer {layer}: max diff {diff} at magnitude {scale}"


def _held_out_prompts(run: dict, limit: int) -> list[list[int]]:
    """The first `limit` prompts of the run's held-out conversations, read here without the app's plan."""
    from workers.stages.evaluate.prompts import prompts_from_prepared
    from workers.contract.chats.prompt_source import validation_rows

    best = next(c for c in run["checkpoints"] if c["is_best"])
    return prompts_from_prepared(Path(run["output_dir"]) / "prepared", validation_rows(Path(best["path"]).parent),
                                 limit=limit)


def test_serve_check_of_a_talkers_draft_agrees_with_our_tau_on_the_same_prompts(talker_run, vllm_install):
    check, ours = talker_run["serve_check"], talker_run["acceptance"]
    assert [s["status"] for s in talker_run["stages"]] == ["succeeded"] * 5, talker_run["stages"]
    assert check["status"] == "succeeded", check["error"]
    k = check["num_speculative_tokens"]
    print(f"talker draft, k={k}: our tau {check['tau']:.4f}, vLLM's on emitted tokens {check['vllm_tau_emitted']:.4f} "
          f"(its counters {check['vllm_tau']:.4f}); {check['vllm_drafts']} drafts in {check['vllm_decode_steps']} "
          f"steps; {check['vllm_replies_cut']} of {check['prompts_count']} replies cut")
    # A draft that learned something, and not a stand-in that accepts everything.
    assert 1.2 < check["tau"] < k + 1 - 0.2 and 1.2 < check["vllm_tau_emitted"] < k + 1 - 0.2, check
    # The very prompts our τ was measured on: the run's held-out conversations, as many as it measured.
    expected = _held_out_prompts(talker_run, TALKER_PROMPTS)
    digest = hashlib.sha256(json.dumps(expected, separators=(",", ":")).encode()).hexdigest()
    assert check["prompts_count"] == ours["num_prompts"] == len(expected) == TALKER_PROMPTS
    assert check["prompts_sha256"] == digest and check["tau"] == pytest.approx(ours["tau"])
    assert check["max_new_tokens"] == TALKER_MAX_NEW_TOKENS
    # Replies that end at the end token and replies cut at max_new_tokens, whose last step's drafts
    # vLLM's counters count past the end: the emitted-token accounting is what makes both agree.
    assert 0 < check["vllm_replies_cut"] < check["prompts_count"], check
    assert check["vllm_decode_steps"] >= check["vllm_drafts"] > 0
    assert abs(check["tau_difference"]) <= 0.05 and check["disagrees"] is False, check
    assert ours["output_matches_greedy"] is True
    assert check["vllm_output_matches_greedy"] is True and check["mismatched_prompts"] == []
    assert check["vllm_version"] == vllm_install.version and check["vllm_build"] == vllm_install.build
    assert check["vllm_tokens_per_s_with"] > 0 and check["vllm_tokens_per_s_without"] > 0
    assert " serve " in check["command"] and '"method": "eagle3"' in check["command"]
    # The run's best, chosen by our τ, shows vLLM's figure beside ours; decoding the same prompts greedily,
    # the two agree within the prompts' noise, so the run page has no disagreement to report.
    best = talker_run["best"]
    print(f"best: our tau {best['tau']:.4f} ± {best['tau_standard_error']:.4f} (standard error over "
          f"{ours['num_prompts']} prompts), vLLM's {best['vllm_tau']:.4f}")
    assert best["checkpoint_id"] == ours["checkpoint_id"] and best["tau"] == pytest.approx(ours["tau"])
    assert best["vllm_tau"] == pytest.approx(check["vllm_tau_emitted"]) and 0 < best["tau_standard_error"] < 1
    assert best["vllm_disagrees"] is False and best["vllm_note"] == ""


def test_a_serve_check_of_another_checkpoint_serves_the_prompts_its_measurement_decoded(talker_run, django_db_blocker):
    """The run measures its other checkpoints too; "Check with vLLM" on one of them serves the prompts
    that measurement decoded, also for a row recorded before such rows kept their count of prompts."""
    from runs.checkpoints.serve_check_services import serve_check_plan, serve_check_request
    from runs.models import Checkpoint
    from workers.stages.evaluate.prompts import prompts_load
    from workers.stages.evaluate.serve_check import prompts_digest

    other = next(c for c in talker_run["checkpoints"] if not c["is_best"])
    assert len(_held_out_prompts(talker_run, 1000)) > TALKER_PROMPTS  # else a lost count would not show
    with django_db_blocker.unblock():
        checkpoint = Checkpoint.objects.get(pk=other["id"])
        measured = checkpoint.evaluations.get()
        assert (measured.max_prompts, measured.num_prompts) == (TALKER_PROMPTS, TALKER_PROMPTS)
        assert measured.max_new_tokens == TALKER_MAX_NEW_TOKENS
        type(measured).objects.filter(pk=measured.pk).update(max_prompts=32)  # as the pipeline left them before
        check, created = serve_check_request(checkpoint=checkpoint, user=None, enqueue=False)
        assert created and check.evaluation_id == measured.pk and check.max_new_tokens == TALKER_MAX_NEW_TOKENS
        plan = serve_check_plan(check=check)
        served = prompts_digest(plan.prompts_checked(prompts_load(plan.prompts)))
        check.delete()
    assert served == (TALKER_PROMPTS, talker_run["serve_check"]["prompts_sha256"])


def test_a_checkpoint_vllm_refuses_fails_quoting_its_log_and_stores_no_result(vllm_run, tiny_target, tmp_path, user):
    from runs.pipeline.jobs.models import ServeCheck
    from runs.models import Checkpoint, Evaluation, StageStatus
    from runs.checkpoints.serve_check_services import serve_check_request
    from workers.orchestration.tasks import stage_execute

    best = next(c for c in vllm_run["checkpoints"] if c["is_best"])
    broken = tmp_path / "broken-draft"
    shutil.copytree(best["path"], broken)
    config = json.loads((broken / "config.json").read_text())
    config["transformer_layer_config"]["num_attention_heads"] = 3  # 128 is not a multiple of 3
    (broken / "config.json").write_text(json.dumps(config))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(tiny_target.chats_path.read_text().splitlines()[:2]) + "\n")
    checkpoint = Checkpoint.objects.create(epoch=0, path=str(broken), imported_at=timezone.now(), imported_by=user,
                                           verifier_path=str(tiny_target.target_dir))
    Evaluation.objects.create(checkpoint=checkpoint, status=StageStatus.SUCCEEDED, tau=2.0, prompts_path=str(prompts),
                              max_new_tokens=8, max_prompts=2)
    check, created = serve_check_request(checkpoint=checkpoint, user=user, enqueue=False)
    assert created and serve_check_request(checkpoint=checkpoint, user=user, enqueue=False) == (check, False)
    assert stage_execute(stage_name="serve_check", record_id=check.pk, worker="test") is False
    check = ServeCheck.objects.get(pk=check.pk)
    assert check.status == StageStatus.FAILED
    assert "vllm serve stopped before it was ready" in check.error and "last lines of" in check.error
    assert check.vllm_tau is None and check.vllm_output_matches_greedy is None and check.tau_difference is None


def test_a_stop_request_mid_check_leaves_no_vllm_process(vllm_run, tiny_target, tmp_path):
    from workers.contract.host.backends import vllm_executable
    from workers.stages.evaluate.serve_check import ServeCheckStopped, serve_check

    best = next(c for c in vllm_run["checkpoints"] if c["is_best"])
    prompts = [[0, 5, 6, 7, 8, 9, 10]] * 4
    ticks: list[int] = []
    before = {p.pid for p in psutil.process_iter()}
    with pytest.raises(ServeCheckStopped, match="after 1 of 4 prompts"):
        serve_check(target_dir=tiny_target.target_dir, checkpoint_dir=Path(best["path"]), prompts=prompts,
                    max_new_tokens=8, out_dir=tmp_path / "check", vllm_executable=vllm_executable(),
                    on_progress=lambda done, total: ticks.append(done), should_stop=lambda: bool(ticks))
    assert ticks == [1]
    deadline = time.monotonic() + 30
    while True:
        left = [p for p in psutil.process_iter(["pid", "cmdline"]) if p.info["pid"] not in before
                and "vllm" in " ".join(p.info["cmdline"] or []) and started_here(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert left == [], [p.info["cmdline"] for p in left]


def test_the_serve_checks_speedup_table_has_a_row_per_concurrency_from_emitted_tokens(talker_run, admin_client):
    """Issue 39's served speed-up at concurrency: one row per level the run asked for, both servers loaded with
    the same requests; output tokens are what the replies emitted (the same greedy texts with the draft and
    without, so the same count on both sides, and the measurement's own count for the prompts once each),
    and the speed-up is the ratio of the stored tokens/s. The run page shows the table as CPU figures."""
    check, ours = talker_run["serve_check"], talker_run["acceptance"]
    assert check["status"] == "succeeded", check["error"]
    rows = check["concurrency_results"]
    print("speed-up by concurrency (CPU figures):", [(r["concurrency"], round(r["tokens_per_s_with"], 1),
          round(r["tokens_per_s_without"], 1), r["tpot_ms_with"] and round(r["tpot_ms_with"], 2),
          r["tpot_ms_without"] and round(r["tpot_ms_without"], 2), round(r["speedup"], 3)) for r in rows])
    assert check["concurrency"] == list(TALKER_CONCURRENCY)
    assert [r["concurrency"] for r in rows] == list(TALKER_CONCURRENCY)
    for row in rows:
        assert row["device"] == "cpu" and row["requests"] == max(row["concurrency"], TALKER_PROMPTS)
        assert row["output_tokens_with"] == row["output_tokens_without"] == ours["new_tokens"], row
        assert row["tokens_per_s_with"] > 0 and row["tokens_per_s_without"] > 0, row
        assert row["tpot_ms_with"] > 0 and row["tpot_ms_without"] > 0, row
        assert row["tokens_per_s_with"] == pytest.approx(row["output_tokens_with"] / row["seconds_with"], rel=1e-3)
        assert row["speedup"] == pytest.approx(row["tokens_per_s_with"] / row["tokens_per_s_without"])
    page = admin_client.get(f"/runs/{talker_run['run_id']}/").content.decode()
    assert "CPU figures" in page and page.count('data-concurrency="') == len(TALKER_CONCURRENCY)
    first = rows[0]
    assert f'{first["speedup"]:.2f}×' in page
