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


def test_the_client_asks_for_a_regeneration_with_its_shards(live_server, launcher_token, tmp_path):
    """`eagle3web datasets regenerate`: the target named by its folder, the job's `shards` stored; the same
    settings with another split answer the same job, the split asked last kept; 0 refused naming `shards`."""
    from runs.models import DatasetRegeneration
    from runs.pipeline import services
    from tests.helpers.fleet import cpu_worker
    from tests.services.data.test_regeneration_request import _target

    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"q {i}"},
                                                                      {"role": "assistant", "content": "a"}]}) + "\n"
                             for i in range(3)))
    target, dataset = _target(tmp_path), services.dataset_register(path=chats)
    services.target_register(path=target)
    cpu_worker(probe_queues=False)
    ask = ("datasets", "regenerate", str(dataset.pk), "--target", str(target), "--backend", "transformers",
           "--max-new-tokens", "16")
    code, out, err = cli("--json", *ask, "--shards", "2", url=live_server.url, token=launcher_token)
    assert code == 0, err
    answer = json.loads(out)
    job = DatasetRegeneration.objects.get()
    assert (answer["queued"], answer["regeneration"]["regeneration_id"], job.shards, job.max_new_tokens) == (
        True, job.pk, 2, 16)
    code, out, err = cli(*ask, "--shards", "3", url=live_server.url, token=launcher_token)
    assert code == 0, err
    assert out.strip() == (f"regeneration {job.pk} of dataset {dataset.pk} (chats.jsonl): queued, 3 shards "
                           "(already asked with these settings)")
    assert DatasetRegeneration.objects.get().shards == 3
    code, out, _ = cli("--json", *ask, "--shards", "0", url=live_server.url, token=launcher_token)
    assert code == 1 and list(json.loads(out)["fields"]) == ["shards"]
    code, out, _ = cli("--json", "datasets", "regenerate", str(dataset.pk), "--target", str(tmp_path / "other"),
                       url=live_server.url, token=launcher_token)
    assert code == 1 and list(json.loads(out)["fields"]) == ["target"]
    assert DatasetRegeneration.objects.count() == 1 and DatasetRegeneration.objects.get().shards == 3
