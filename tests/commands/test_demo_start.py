"""`make demo`'s first start: the build says how far it is, the login is printed once the server answers
and again, last, once both workers (one for the cpu queue, one that trains) are ready."""
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core.management import CommandError, call_command

from runs.management.commands.build_demo_assets import BuildProgress

pytestmark = pytest.mark.django_db


def test_build_progress_shows_the_step_and_an_estimate():
    out = io.StringIO()
    progress = BuildProgress(out, interval=0)
    progress.started -= 10  # ten seconds in, a quarter done: about thirty left
    progress(25, 100)
    progress(100, 100)
    progress.done()
    text = out.getvalue()
    assert "step 25 of 100, about 30 s left" in text
    assert "step 100 of 100" in text and "Demo target ready in" in text


class _Slow(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(302)
        self.send_header("Location", "/accounts/login/")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_login_is_printed_once_the_server_answers(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    server = HTTPServer(("127.0.0.1", 0), _Slow)
    port = server.server_address[1]
    server.server_close()  # nothing listens yet: the command must wait
    answering = HTTPServer(("127.0.0.1", port), _Slow)

    def start_later():
        time.sleep(1.0)
        answering.serve_forever()

    threading.Thread(target=start_later, daemon=True).start()
    out = io.StringIO()
    started = time.monotonic()
    call_command("demo_login", wait_for=f"http://127.0.0.1:{port}/", timeout=30, stdout=out)
    answering.shutdown()
    assert time.monotonic() - started >= 0.9
    lines = [line for line in out.getvalue().splitlines() if line]
    assert lines[0] == f"eagle3web is up: http://127.0.0.1:{port}/"
    assert lines[1].startswith("Log in as: demo / ")


def test_a_server_that_never_answers_is_named(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    server = HTTPServer(("127.0.0.1", 0), _Slow)
    port = server.server_address[1]
    server.server_close()
    with pytest.raises(CommandError, match=f"did not answer at http://127.0.0.1:{port}/ within 1 s"):
        call_command("demo_login", wait_for=f"http://127.0.0.1:{port}/", timeout=1, stdout=io.StringIO())


def _heartbeat(name: str, queues: list[str], *, started_at):
    from runs.fleet.services import worker_heartbeat

    return worker_heartbeat(name=name, hostname="demo-host", capabilities={}, queues=queues, started_at=started_at)


def test_the_login_is_printed_again_last_once_every_worker_is_ready(settings, tmp_path):
    from django.utils import timezone

    settings.DATA_DIR = tmp_path
    answering = HTTPServer(("127.0.0.1", 0), _Slow)
    port = answering.server_address[1]
    threading.Thread(target=answering.serve_forever, daemon=True).start()
    since = time.time() - 5
    _heartbeat("gpu@demo-host", ["gpu", "vllm.1"], started_at=timezone.now())
    _heartbeat("cpu@demo-host", ["cpu"], started_at=timezone.now())
    out = io.StringIO()
    call_command("demo_login", wait_for=f"http://127.0.0.1:{port}/", timeout=30, workers="cpu,gpu", since=since,
                 stdout=out)
    answering.shutdown()
    lines = [line for line in out.getvalue().splitlines() if line]
    password = (tmp_path / "demo" / "login.txt").read_text().strip()
    assert lines == [f"eagle3web is up: http://127.0.0.1:{port}/", f"Log in as: demo / {password}",
                     "Workers ready: cpu@demo-host takes cpu; gpu@demo-host takes gpu, vllm.1",
                     f"eagle3web is up: http://127.0.0.1:{port}/", f"Log in as: demo / {password}",
                     "(Ctrl-C stops the web server and the workers)"]


def test_a_worker_from_an_earlier_start_does_not_count_and_the_missing_one_is_named(settings, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    settings.DATA_DIR = tmp_path
    _heartbeat("gpu@demo-host", ["gpu"], started_at=timezone.now() - timedelta(minutes=5))  # beats, but started before
    _heartbeat("cpu@demo-host", ["cpu"], started_at=timezone.now())
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    call_command("demo_login", workers="cpu,gpu", since=time.time() - 60, workers_timeout=1, stdout=out, stderr=err)
    assert time.monotonic() - started >= 1
    assert "no worker gpu@ reported ready within 1 s" in err.getvalue()
    lines = [line for line in out.getvalue().splitlines() if line]
    assert lines[-2:] == ["Workers ready: cpu@demo-host takes cpu", lines[0]]
    assert lines[0].startswith("Log in as: demo / ")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_make_demo_starts_a_worker_for_the_cpu_queue_apart_from_the_one_that_trains(tmp_path):
    """The demo's start as the Makefile has it (`make -n demo`, past the setup and the build): the
    short jobs' worker takes cpu alone, the training one gpu (and vLLM's queue where installed), and
    the login comes last, after both workers said ready. A verification goes to the cpu worker."""
    import os
    import re
    import signal
    import subprocess
    from pathlib import Path

    from django.conf import settings as django_settings

    from runs.data.extractions import extraction_import
    from runs.fleet.models import Worker
    from runs.models import StageAttempt
    from runs.pipeline.jobs.services import extraction_verify_request
    from tests.helpers.outage import free_port
    from tests.contract.test_verify import H, N, write_flat
    from tests.helpers.worker import BASE_DIR, test_database_url
    from workers.contract.host.backends import BACKENDS, stage_queue

    port = free_port()
    recipe = subprocess.run(["make", "-n", "demo", f"PORT={port}"], cwd=BASE_DIR, capture_output=True, text=True,
                            check=True).stdout
    start = recipe[recipe.index("since=$(date"):]  # what follows the setup and the demo's build
    env = {**os.environ, "DATABASE_URL": test_database_url(), "CELERY_BROKER_URL": django_settings.CELERY_BROKER_URL,
           "EAGLE3WEB_DATA_DIR": str(tmp_path), "EAGLE3WEB_DATA_ROOTS": str(tmp_path)}
    # Every queue the demo's workers may take (cpu, gpu, and a backend's one-GPU queue it runs on the CPU, such as
    # vLLM's vllm.1): a message an earlier test left there would be taken at the start, its log after the banner.
    queues = {"cpu", *(stage_queue(backend=backend.name, gpus=1) for backend in BACKENDS)}
    purge = [".venv/bin/python", "-m", "celery", "-A", "eagle3web", "purge", "-f", "-Q", ",".join(sorted(queues))]
    subprocess.run(purge, env=env, cwd=BASE_DIR, check=True, capture_output=True, timeout=60)
    log_path = tmp_path / "demo.log"
    with log_path.open("w") as log:
        demo = subprocess.Popen(["bash", "-c", start], cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while "(Ctrl-C stops" not in log_path.read_text():
            assert demo.poll() is None and time.monotonic() < deadline, log_path.read_text()[-4000:]
            time.sleep(0.5)
        workers = {w.name.partition("@")[0]: w for w in Worker.objects.all()}
        assert workers["cpu"].queues == ["cpu"]
        assert workers["gpu"].queues[0] == "gpu" and "cpu" not in workers["gpu"].queues
        text = log_path.read_text()
        ready = [m.start() for m in re.finditer(r"\S+@\S+ ready\.", text)]
        lines = [line for line in text[max(ready):].splitlines() if line.strip()]
        assert len(ready) == 2 and lines[-4].startswith("Workers ready: cpu@"), text[-3000:]
        assert lines[-2].startswith("Log in as: demo / ") and lines[-3] == f"eagle3web is up: http://127.0.0.1:{port}/"

        target = tmp_path / "target"
        target.mkdir()
        (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                        "num_hidden_layers": N, "hidden_size": H, "vocab_size": 1000}))
        extraction, _ = extraction_import(path=write_flat(Path(tmp_path) / "e"), target_path=target)
        request = extraction_verify_request(extraction=extraction, full=True)
        while request.status != "succeeded":
            assert time.monotonic() < deadline + 120, (request.status, request.error, log_path.read_text()[-3000:])
            time.sleep(0.5)
            request.refresh_from_db()
        assert StageAttempt.objects.get(stage="verify", record_id=request.pk).worker.startswith("cpu@")
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(timeout=60)


def test_the_demos_file_system_broker_writes_nothing_into_the_directory_it_was_started_from(tmp_path):
    """kombu's file-system transport keeps its exchange tables in "control" under the working
    directory unless told otherwise: `make demo` from a clone left control/*.exchange in it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    started_in, data = tmp_path / "clone", tmp_path / "data"
    started_in.mkdir()
    env = {**os.environ, "CELERY_BROKER_URL": "filesystem://", "EAGLE3WEB_DATA_DIR": str(data),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "PYTHONPATH": str(root),
           "DJANGO_SETTINGS_MODULE": "eagle3web.settings"}
    send = ("import django; django.setup(); from eagle3web.celery import celery_app; "
            "celery_app.send_task('eagle3web.stage', args=['prepare', 1], queue='cpu')")
    subprocess.run([sys.executable, "-c", send], cwd=started_in, env=env, check=True, timeout=120,
                   capture_output=True)
    assert list(started_in.iterdir()) == []
    assert [p.name for p in (data / "broker" / "control").iterdir()] == ["cpu.exchange"]
    assert len(list((data / "broker" / "queue").iterdir())) == 1  # the message went where the workers read
