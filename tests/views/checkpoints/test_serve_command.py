"""Every page prints the serve command vLLM accepts: the target, with the draft in --speculative-config."""
import json
import shlex

import pytest

from runs.pipeline import services
from runs.models import Checkpoint
from runs.pipeline.launch.run_config import RunConfig

pytestmark = pytest.mark.django_db


def test_run_and_checkpoint_pages_print_the_target_first_form(client, user, roots):
    data = roots
    run = services.run_launch(user=user, target_path=data / "target", dataset_path=data / "chats.jsonl",
                              config=RunConfig(), enqueue=False)
    ckpt_dir = data / "runs" / "ckpt 0"
    ckpt_dir.mkdir(parents=True)
    (ckpt_dir / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"proposal_type": "greedy", "speculative_tokens": 4}]}}))
    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=str(ckpt_dir))
    client.force_login(user)
    summary = client.get(f"/api/v1/runs/{run.pk}/status/").json()
    argv = shlex.split(summary["checkpoints"][0]["serve_command"])
    assert argv[:4] == ["vllm", "serve", str((data / "target").resolve()), "--speculative-config"]
    assert json.loads(argv[4]) == {"model": str(ckpt_dir), "method": "eagle3", "num_speculative_tokens": 4}
    for url in (run.get_absolute_url(), checkpoint.get_absolute_url()):
        page = client.get(url).content.decode()
        assert "--speculative-config" in page and f"vllm serve {ckpt_dir}" not in page


def test_the_status_poll_uses_the_count_stored_at_registration(client, user, roots):
    from runs.pipeline.lifecycle.result_records import checkpoints_register

    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(), enqueue=False)
    ckpt_dir = roots / "runs" / "ckpt 1"
    ckpt_dir.mkdir(parents=True)
    (ckpt_dir / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"proposal_type": "greedy", "speculative_tokens": 5}]}}))
    checkpoint, = checkpoints_register(training_run_id=run.training_run.pk, checkpoints=[{"epoch": 1, "path": ckpt_dir}])
    assert checkpoint.speculative_tokens == 5
    (ckpt_dir / "config.json").unlink()  # the poll no longer reads it
    client.force_login(user)
    argv = shlex.split(client.get(f"/api/v1/runs/{run.pk}/status/").json()["checkpoints"][0]["serve_command"])
    assert json.loads(argv[4])["num_speculative_tokens"] == 5
