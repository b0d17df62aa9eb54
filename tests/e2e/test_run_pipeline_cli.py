"""`manage.py run_pipeline --inline --json`: the same launch as the form, run in-process."""
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

CHECKER = Path(settings.BASE_DIR).parent / "shared" / "tools" / "check_run_outputs.py"


def run_cli(*args):
    out = io.StringIO()
    call_command("run_pipeline", *args, "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1]), out.getvalue()


@pytest.fixture(scope="module")
def inline_run(tiny_target, django_db_setup, django_db_blocker, tmp_path_factory):
    """One real run shared by the tests below (it takes seconds); its rows are removed afterwards."""
    from django.contrib.auth import get_user_model
    from django.test import override_settings

    from runs.models import Dataset, PipelineRun, TargetModel

    root = tmp_path_factory.getbasetemp().resolve()
    with django_db_blocker.unblock(), override_settings(EAGLE3WEB_DATA_ROOTS=[root], EAGLE3WEB_RUNS_DIR=root / "cli-runs"):
        summary, raw = run_cli("--target", str(tiny_target.target_dir), "--dataset", str(tiny_target.chats_path),
                               "--layer-ids", "2,4,5", "--max-samples", "40", "--max-seq-len", "256",
                               "--draft-vocab-size", "256", "--epochs", "2", "--inline")
        yield summary, raw
        PipelineRun.objects.all().delete()
        TargetModel.objects.all().delete()
        Dataset.objects.all().delete()
        get_user_model().objects.all().delete()


def test_inline_run_succeeds_and_summarises_every_stage(inline_run):
    summary, _ = inline_run
    assert [s["name"] for s in summary["stages"]] == ["prepare", "extract", "vocab", "train", "evaluate"]
    assert [s["status"] for s in summary["stages"]] == ["succeeded"] * 5
    assert all(s["seconds"] > 0 for s in summary["stages"])
    assert summary["extraction"]["layer_ids"] == [2, 4, 5, 8]
    assert summary["tokens"]["loss_tokens"] > 0
    assert Path(summary["manifest_path"]).name == "data_config.json"


def test_measuring_acceptance_counts_every_checkpoints_prompts_in_one_progress(inline_run):
    """The evaluate stage measures every checkpoint; its progress counts them all (the page showed "–" until
    the last one began, then that one's prompts alone)."""
    summary, _ = inline_run
    evaluate = next(s for s in summary["stages"] if s["name"] == "evaluate")
    prompts = summary["acceptance"]["num_prompts"]
    assert prompts > 0 and len(summary["checkpoints"]) == 2
    # Each checkpoint's prompts twice: the measurement, then the k table's probes (EAGLE3WEB_K_BEYOND_TRAINED=2).
    assert evaluate["progress_total"] == 2 * prompts * len(summary["checkpoints"]) == evaluate["progress_done"]


def test_each_checkpoint_loads_in_speculators_and_names_verifier_and_layers(inline_run, tiny_target):
    from speculators.models.eagle3 import Eagle3DraftModel

    summary, _ = inline_run
    assert len(summary["checkpoints"]) == 2
    for ckpt in summary["checkpoints"]:
        model = Eagle3DraftModel.from_pretrained(ckpt["path"])
        config = json.loads((Path(ckpt["path"]) / "config.json").read_text())
        assert config["speculators_config"]["verifier"]["name_or_path"] == str(tiny_target.target_dir)
        assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
        assert model.config.draft_vocab_size == 256


def test_reviewers_checker_finds_no_problem_in_the_run(inline_run, tiny_target, tmp_path):
    if not CHECKER.exists():
        pytest.skip(f"{CHECKER} is not beside this checkout")
    summary, raw = inline_run
    summary_file = tmp_path / "summary.json"
    summary_file.write_text(raw)
    result = subprocess.run([sys.executable, str(CHECKER), str(summary_file), str(tiny_target.target_dir)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_malformed_dataset_is_refused_at_launch_naming_the_line(tiny_target, data_root):
    from runs.models import Dataset, PipelineRun

    bad = data_root / "bad-chats.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{oops\n')
    runs_before = PipelineRun.objects.count()
    with pytest.raises(CommandError, match="bad-chats.jsonl, line 2"):
        run_cli("--target", str(tiny_target.target_dir), "--dataset", str(bad), "--inline")
    assert PipelineRun.objects.count() == runs_before
    assert not Dataset.objects.filter(path=str(bad.resolve())).exists()


def test_a_checkpoint_made_elsewhere_imports_once(inline_run, data_root, tmp_path):
    import shutil

    summary, _ = inline_run
    copy = data_root / "elsewhere-ckpt"
    shutil.copytree(summary["checkpoints"][-1]["path"], copy, symlinks=True)
    out = io.StringIO()
    call_command("import_checkpoint", str(copy), "--json", stdout=out)
    first = json.loads(out.getvalue())
    assert first["created"] and first["aux_layer_ids"] == [2, 4, 5] and first["draft_vocab_size"] == 256
    out = io.StringIO()
    call_command("import_checkpoint", str(copy), "--json", stdout=out)
    assert json.loads(out.getvalue()) == {**first, "created": False}


def test_a_checkpoint_of_another_kind_is_refused_naming_the_field(inline_run, data_root):
    import shutil

    summary, _ = inline_run
    copy = data_root / "not-eagle3"
    shutil.copytree(summary["checkpoints"][0]["path"], copy, symlinks=True)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "speculators_model_type": "mlp"}))
    with pytest.raises(CommandError, match="speculators_model_type is 'mlp', expected 'eagle3'"):
        call_command("import_checkpoint", str(copy), "--json", stdout=io.StringIO())


def test_a_reviewer_approves_a_checkpoint_on_its_page(inline_run, client):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from runs.models import Checkpoint

    reviewer = get_user_model().objects.create_user("rho", password="pw-rho-1")
    reviewer.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    client.login(username="rho", password="pw-rho-1")
    summary, _ = inline_run
    ckpt = Checkpoint.objects.get(path=summary["checkpoints"][-1]["path"])
    response = client.post(f"/reviews/checkpoint/{ckpt.pk}/", {"decision": "approve", "text": "ship it"}, follow=True)
    page = response.content.decode()
    assert "vllm serve" in page and "ship it" in page and "Approve" in page
    assert ckpt.reviews.get().author == reviewer


def test_the_run_measures_acceptance_of_its_best_checkpoint_with_greedy_equal_output(inline_run):
    summary, _ = inline_run
    acceptance = summary["acceptance"]
    best = next(c for c in summary["checkpoints"] if c["is_best"])
    assert acceptance["status"] == "succeeded" and acceptance["checkpoint_id"] == best["id"]
    assert acceptance["output_matches_greedy"] is True
    k = acceptance["num_speculative_tokens"]
    assert k == 3 and 1.0 <= acceptance["tau"] <= k + 1
    # Tokens per verification forward, counting only the output's (after each prompt's prefill token).
    emitted = acceptance["new_tokens"] - acceptance["num_prompts"]
    assert acceptance["tau"] == pytest.approx(emitted / acceptance["verify_forwards"])
    assert best["tau"] == acceptance["tau"] and best["simulated_tau"] == acceptance["simulated_tau"] > 1.0
    assert acceptance["prompt_source"].startswith("validation conversations of")
    # The run's other checkpoint is measured too, on the same prompts.
    assert all(c["tau"] is not None and 1.0 <= c["tau"] <= k + 1 for c in summary["checkpoints"])


def test_the_train_stage_says_every_supervised_token_was_trained(inline_run):
    summary, _ = inline_run
    train = next(s for s in summary["stages"] if s["name"] == "train")
    assert train["loss_tokens_trained"] == train["loss_tokens_available"] > 0
    assert train["split"]["by"] == "conversation" and train["warnings"] == []
    assert train["split"]["train_rows"] + train["split"]["val_rows"] == summary["tokens"]["rows"]


def evaluate_cli(*args):
    out = io.StringIO()
    call_command("evaluate_checkpoint", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_evaluate_checkpoint_by_id_on_a_prompts_file(inline_run, tiny_target):
    from runs.models import Checkpoint

    summary, _ = inline_run
    ckpt = Checkpoint.objects.get(path=summary["checkpoints"][0]["path"])
    result = evaluate_cli(str(ckpt.pk), "--prompts", str(tiny_target.chats_path), "--max-prompts", "3",
                          "--max-new-tokens", "24", "--num-speculative-tokens", "2")
    assert result["status"] == "succeeded" and result["output_matches_greedy"] is True
    assert result["num_prompts"] == 3 and result["num_speculative_tokens"] == 2
    assert len(result["acceptance_per_position"]) == 2 and 1.0 <= result["tau"] <= 3.0
    assert result["prompt_source"] == str(tiny_target.chats_path)


def test_evaluate_checkpoint_imports_a_directory_and_needs_prompts_for_it(inline_run, data_root, tiny_target):
    import shutil

    summary, _ = inline_run
    copy = data_root / "evaluated-elsewhere"
    shutil.copytree(summary["checkpoints"][-1]["path"], copy, symlinks=True)
    with pytest.raises(CommandError, match="was not trained here, so it has no validation conversations; give a prompts file"):
        evaluate_cli(str(copy))
    result = evaluate_cli(str(copy), "--prompts", str(tiny_target.chats_path), "--max-prompts", "2")
    assert result["output_matches_greedy"] is True and result["tau"] >= 1.0


def test_a_user_measures_a_checkpoint_from_its_page(inline_run, client, user):
    """The button queues an evaluation; here the worker's part runs in-process (the worker itself is
    exercised by tests/e2e/test_pipeline_worker.py)."""
    from runs.models import Checkpoint, Evaluation
    from workers.orchestration.tasks import stage_execute

    client.login(username=user.username, password=user.raw_password)
    summary, _ = inline_run
    ckpt = Checkpoint.objects.get(path=summary["checkpoints"][0]["path"])
    response = client.post(f"/checkpoints/{ckpt.pk}/evaluate/", {"max_prompts": "2", "max_new_tokens": "16"},
                           follow=True)
    assert "queued" in response.content.decode()
    evaluation = Evaluation.objects.filter(checkpoint=ckpt, run=None).latest("id")
    assert evaluation.status == "queued" and evaluation.requested_by == user
    assert stage_execute(stage_name="evaluate", record_id=evaluation.pk, worker="test")
    page = client.get(f"/checkpoints/{ckpt.pk}/").content.decode()
    evaluation.refresh_from_db()
    assert f"{evaluation.tau:.2f}" in page and "equals greedy decoding token for token" in page
    assert 'id="plot-acceptance"' in page


def test_a_bad_evaluation_request_names_the_problem_and_stores_nothing(inline_run, client, user):
    from runs.models import Checkpoint, Evaluation

    client.login(username=user.username, password=user.raw_password)
    summary, _ = inline_run
    ckpt = Checkpoint.objects.get(path=summary["checkpoints"][0]["path"])
    before = Evaluation.objects.count()
    for data, message in [({"max_new_tokens": "0"}, "max_new_tokens must be between 1 and 4096, got 0"),
                          ({"num_speculative_tokens": "x"}, "draft tokens per step must be a whole number"),
                          ({"prompts_path": "/etc/passwd"}, "prompts file /etc/passwd is outside the allowed data roots")]:
        page = client.post(f"/checkpoints/{ckpt.pk}/evaluate/", data, follow=True).content.decode()
        assert message in page
    assert Evaluation.objects.count() == before


def test_importing_what_a_run_wrote_links_to_the_run_instead_of_duplicating_it(inline_run):
    from runs.models import Checkpoint, Extraction

    summary, _ = inline_run
    out = io.StringIO()
    call_command("import_extraction", summary["extraction"]["hidden_states_dir"].rsplit("/", 1)[0], "--json", stdout=out)
    imported = json.loads(out.getvalue())
    extraction = Extraction.objects.get(pk=imported["extraction_id"])
    assert extraction.produced_by.run_id == summary["run_id"] and extraction.imported_at is None
    assert extraction.pk == summary["ids"]["extraction"] == summary["extraction"]["id"]
    assert Extraction.objects.count() == 1
    out = io.StringIO()
    call_command("import_checkpoint", summary["checkpoints"][0]["path"], "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert result["created"] is False and result["checkpoint_id"] == summary["checkpoints"][0]["id"]
    assert Checkpoint.objects.get(pk=result["checkpoint_id"]).training_run.run_id == summary["run_id"]
