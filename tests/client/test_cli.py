"""The `eagle3web` command (the client package's console script) run as a real subprocess against a real
server: JSON out with --json, errors as JSON with a non-zero exit; and the package imports no Django."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runs.pipeline.models import PipelineRun

EAGLE3WEB = Path(sys.executable).parent / "eagle3web"  # installed by `pip install -e ./client` (make setup)


def cli(*args: str, url: str | None, token: str | None, timeout: float = 60) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3WEB_")}
    env.update({"EAGLE3WEB_URL": url or "", "EAGLE3WEB_TOKEN": token or ""})
    done = subprocess.run([str(EAGLE3WEB), *args], env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def test_the_command_launches_lists_shows_cancels_and_waits_in_json(live_server, launcher_token, roots):
    code, out, err = cli("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset",
                         str(roots / "chats.jsonl"), "--layer-ids", "3,6", "--epochs", "1", "--draft-vocab-size", "64",
                         "--name", "from the shell", "--best-by", "val_loss", url=live_server.url, token=launcher_token)
    assert code == 0, err
    run = json.loads(out)
    stored = PipelineRun.objects.get(pk=run["id"])
    assert (stored.name, stored.config["layer_ids"], stored.config["epochs"], stored.config["draft_vocab_size"],
            stored.config["best_by"]) == ("from the shell", [3, 6, 8], 1, 64, "val_loss")
    code, out, _ = cli("--json", "runs", "list", "--owner", "cluster-bot", url=live_server.url, token=launcher_token)
    assert code == 0 and [r["id"] for r in json.loads(out)] == [run["id"]]
    code, out, _ = cli("--json", "runs", "status", str(run["id"]), url=live_server.url, token=launcher_token)
    assert code == 0 and (json.loads(out)["status"], json.loads(out)["name"]) == ("queued", "from the shell")
    code, out, _ = cli("--json", "runs", "wait", str(run["id"]), "--wait-timeout", "0.5", "--poll", "0.2",
                       url=live_server.url, token=launcher_token)
    timed_out = json.loads(out)
    assert code == 3 and timed_out["run"]["status"] == "queued"
    assert timed_out["error"] == f"run {run['id']} is still queued after 0.5 s"
    code, out, _ = cli("--json", "runs", "cancel", str(run["id"]), url=live_server.url, token=launcher_token)
    assert code == 0 and json.loads(out) == {"id": run["id"], "cancelled": 5}
    code, out, _ = cli("--json", "runs", "wait", str(run["id"]), url=live_server.url, token=launcher_token)
    assert code == 4 and json.loads(out)["status"] == "cancelled"  # finished, but not succeeded
    code, out, err = cli("runs", "status", str(run["id"]), url=live_server.url, token=launcher_token)
    assert code == 0 and out == f"run {run['id']} (from the shell): cancelled\n" and err == ""


def test_the_command_prints_errors_as_json_and_exits_non_zero(live_server, launcher_token, roots):
    code, out, _ = cli("--json", "runs", "list", url=live_server.url, token="e3w_not-a-token")
    answer = json.loads(out)
    assert code == 1 and answer["status"] == 401 and set(answer) == {"error", "status", "fields"}
    code, out, _ = cli("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset", str(roots / "nope.jsonl"),
                       url=live_server.url, token=launcher_token)
    answer = json.loads(out)
    assert code == 1 and answer["status"] == 400 and list(answer["fields"]) == ["dataset"]
    assert PipelineRun.objects.count() == 0
    code, out, _ = cli("--json", "runs", "status", "424242", url=live_server.url, token=launcher_token)
    assert code == 1 and json.loads(out) == {"error": "no run 424242", "status": 404, "fields": {}}
    code, out, _ = cli("--json", "runs", "list", url=None, token=None)
    assert code == 1 and json.loads(out)["fields"] == {"url": "missing", "token": "missing"}
    code, out, err = cli("runs", "list", url=live_server.url, token="e3w_not-a-token")
    assert code == 1 and out == "" and err.startswith("eagle3web: GET /api/v1/runs/: 401 ")


@pytest.mark.parametrize("module", ["eagle3web_client", "eagle3web_client.cli"])
def test_the_client_package_imports_neither_django_nor_celery(module):
    code = ("import sys, " + module + "; print(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'django', 'celery', 'torch', 'rest_framework', 'runs', 'workers', 'eagle3web'}))")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2] / "client")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
