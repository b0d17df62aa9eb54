"""The `eagle3web` client launches an online run (issue 27) with the launch API's names as flags, and the
server's refusal of a bad capture URL comes back naming the field, as JSON with a non-zero exit."""
from __future__ import annotations

import json

from runs.pipeline.models import PipelineRun
from tests.client.test_cli import cli


def test_the_client_launches_an_online_run_and_relays_a_refusal(live_server, launcher_token, roots):
    code, out, err = cli("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset",
                         str(roots / "chats.jsonl"), "--draft-vocab-size", "64", "--hidden-states", "online",
                         "--capture-servers", "0", "--capture-url", "http://10.0.0.7:8000", "--capture-url",
                         "http://10.0.0.8:8000", "--hidden-states-cache-gib", "1.5",
                         url=live_server.url, token=launcher_token)
    assert code == 0, err
    config = PipelineRun.objects.get(pk=json.loads(out)["id"]).config
    assert (config["hidden_states"], config["capture_servers"], config["capture_urls"],
            config["hidden_states_cache_gib"]) == ("online", 0, ["http://10.0.0.7:8000", "http://10.0.0.8:8000"], 1.5)

    code, out, _ = cli("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset",
                       str(roots / "chats.jsonl"), "--hidden-states", "online", "--capture-servers", "0",
                       "--capture-url", "ftp://10.0.0.7:21", url=live_server.url, token=launcher_token)
    assert code == 1
    assert "URL 1 'ftp://10.0.0.7:21' must start with http:// or https://" in json.loads(out)["fields"]["capture_urls"]
    assert PipelineRun.objects.count() == 1
