"""The run page's backend line says where a stage ran once it did ("Transformers ran on cpu"), not the GPU
count it was routed by with a hedge ("on 1 GPU (the CPU on a worker without one)", which a user on a
machine without a GPU read as a claim that a GPU had run it)."""
from __future__ import annotations

import re

import pytest

from runs.models import ExtractStage
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig

pytestmark = pytest.mark.django_db


def _backend_line(client, run) -> str:
    page = client.get(f"/runs/{run.pk}/").content.decode()
    return re.sub(r"<[^>]+>", "", re.search(r'<p class="hint" id="backends">(.*?)</p>', page, re.S).group(1))


def test_the_backend_line_says_where_a_stage_ran_and_before_that_where_it_may(client, user, roots,
                                                                               django_capture_on_commit_callbacks):
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64), enqueue=False)
    client.force_login(user)
    before = _backend_line(client, run)
    assert "Extraction: Transformers on 1 GPU, or the CPU of a worker without one" in before
    assert "(the CPU on a worker without one)" not in before
    with django_capture_on_commit_callbacks(execute=True):  # the page's change counter moves on commit
        ExtractStage.objects.filter(run=run).update(status="succeeded", device="cpu")
    after = _backend_line(client, run)
    assert "Extraction: Transformers ran on cpu" in after and "Extraction: Transformers on 1 GPU" not in after
    assert "Training: " in after and "ran on" not in after.split("Training: ")[1]  # not trained yet
