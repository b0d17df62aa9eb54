"""Evaluation suites end to end: `run_pipeline --inline --eval-suite code=FILE` on the demo target. The evaluate
stage measures every checkpoint on the suite beside the held-out prompts, and each suite figure equals the
evaluate stage function run on that suite's prompts alone (the same τ, acceptance by position and k table)."""
import io
import json

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

PROMPTS, NEW_TOKENS = 4, 16


@pytest.fixture(scope="module")
def suite_run(tiny_target, django_db_setup, django_db_blocker, tmp_path_factory):
    from django.contrib.auth import get_user_model
    from django.test import override_settings

    from runs.models import Dataset, EvalSuite, PipelineRun, TargetModel

    root = tmp_path_factory.getbasetemp().resolve()
    code = root / "suite-code.jsonl"
    # The demo's last chats, as a team's own traffic would be: another prompt set than the held-out split's.
    code.write_text("".join(tiny_target.chats_path.read_text().splitlines(keepends=True)[-PROMPTS:]))
    with django_db_blocker.unblock(), override_settings(EAGLE3WEB_DATA_ROOTS=[root], EAGLE3WEB_RUNS_DIR=root / "suite-runs"):
        out = io.StringIO()
        call_command("run_pipeline", "--target", str(tiny_target.target_dir), "--dataset", str(tiny_target.chats_path),
                     "--layer-ids", "2,4,5", "--max-samples", "40", "--max-seq-len", "256", "--draft-vocab-size", "256",
                     "--epochs", "2", "--eval-prompts", str(PROMPTS), "--eval-max-new-tokens", str(NEW_TOKENS),
                     "--eval-suite", f"code={code}", "--inline", "--json", stdout=out)
        yield json.loads(out.getvalue().strip().splitlines()[-1]), code
        PipelineRun.objects.all().delete()
        TargetModel.objects.all().delete()
        Dataset.objects.all().delete()
        EvalSuite.objects.all().delete()
        get_user_model().objects.all().delete()


def test_every_checkpoint_carries_tau_by_suite_and_by_k(suite_run):
    summary, _ = suite_run
    assert summary["status"] == "succeeded", summary["status_reason"]
    assert len(summary["checkpoints"]) == 2
    for c in summary["checkpoints"]:
        assert set(c["tau_by_suite"]) == {"held_out", "code"}
        assert c["tau_by_suite"]["held_out"] == c["tau_for_best"]
        assert list(c["tau_by_k"]) == ["1", "2", "3", "4", "5"]  # trained for 3 steps, measured to 3 + 2 (JSON keys)
        assert str(c["recommended_k"]) in c["tau_by_k"]
        assert c["tau_by_k"]["3"] == c["tau_for_best"]  # the table's k = 3 is the stage's own decode
        spec = json.loads(c["serve_command"].split("--speculative-config ", 1)[1].strip("'"))
        assert spec["num_speculative_tokens"] == c["recommended_k"]


def test_tau_on_a_suite_equals_tau_measured_on_that_suite_alone(suite_run, tiny_target):
    from runs.models import Evaluation
    from workers.stages.evaluate.measure import evaluate
    from workers.stages.evaluate.prompts import prompts_from_file

    summary, code = suite_run
    prompts = prompts_from_file(code, tiny_target.target_dir, limit=PROMPTS)
    assert len(prompts) == PROMPTS
    for c in summary["checkpoints"]:
        stored = Evaluation.objects.get(checkpoint_id=c["id"], suite="code")
        alone = evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=c["path"], prompts=prompts,
                         prompt_source="code alone", max_new_tokens=NEW_TOKENS)
        assert stored.num_prompts == PROMPTS and stored.prompts_path == str(code)
        assert c["tau_by_suite"]["code"] == stored.tau == alone.tau
        assert stored.acceptance_per_position == alone.acceptance_per_position
        assert stored.k_table["rows"] == json.loads(json.dumps(alone.k_table["rows"]))
