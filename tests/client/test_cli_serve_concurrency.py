"""The `eagle3web` client's --serve-concurrency (issue 39): the launch API's `serve_concurrency`, and its
refusals naming the field, a word that is not a number before any request and a level out of range by the server."""
from __future__ import annotations

import json

from runs.pipeline.models import PipelineRun
from tests.client.test_cli import cli


def test_the_client_launches_with_serve_concurrency_and_names_the_field_when_refused(live_server, launcher_token, roots):
    launch = ("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
              "--draft-vocab-size", "64")
    code, out, err = cli(*launch, "--serve-concurrency", "4,1,64", url=live_server.url, token=launcher_token)
    assert code == 0, err
    assert PipelineRun.objects.get(pk=json.loads(out)["id"]).config["serve_concurrency"] == [1, 4, 64]
    code, out, _ = cli(*launch, "--serve-concurrency", "1,512", url=live_server.url, token=launcher_token)
    assert code == 1 and "got 512" in json.loads(out)["fields"]["serve_concurrency"], out
    code, out, _ = cli(*launch, "--serve-concurrency", "one", url=live_server.url, token=launcher_token)
    assert code == 1 and "serve_concurrency" in json.loads(out)["fields"], out
    assert PipelineRun.objects.count() == 1
