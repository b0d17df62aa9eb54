"""The `eagle3web` client's --shards (issue 36): the launch API's `shards`, and its refusal naming the field."""
from __future__ import annotations

import json

from runs.pipeline.models import PipelineRun
from tests.client.test_cli import cli


def test_the_client_launches_with_shards(live_server, launcher_token, roots):
    code, out, err = cli("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset",
                         str(roots / "chats.jsonl"), "--draft-vocab-size", "64", "--shards", "4",
                         url=live_server.url, token=launcher_token)
    assert code == 0, err
    assert PipelineRun.objects.get(pk=json.loads(out)["id"]).config["shards"] == 4
    code, out, _ = cli("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset",
                       str(roots / "chats.jsonl"), "--shards", "0", url=live_server.url, token=launcher_token)
    assert code == 1 and "shards" in json.loads(out)["fields"]
