"""Every page prints the serve command vLLM accepts: the target, with the draft in --speculative-config."""
import json
import shlex

import pytest

from runs import services
from runs.models import Checkpoint
from runs.run_config import RunConfig

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
    summary = client.get(f"/api/runs/{run.pk}/").json()
    argv = shlex.split(summary["checkpoints"][0]["serve_command"])
    assert argv[:4] == ["vllm", "serve", str((data / "target").resolve()), "--speculative-config"]
    assert json.loads(argv[4]) == {"model": str(ckpt_dir), "method": "eagle3", "num_speculative_tokens": 4}
    for url in (run.get_absolute_url(), checkpoint.get_absolute_url()):
        page = client.get(url).content.decode()
        assert "--speculative-config" in page and f"vllm serve {ckpt_dir}" not in page
