"""A FIFO or a device where a user names a file is refused at once, naming what it is, instead of a
request or command waiting forever for a writer (a probe hung a web thread on `mkfifo D/config.json`)."""
import io
import json
import os
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from runs.models import Checkpoint
from tests.commands.test_import_checkpoint_verifier import made_elsewhere, placed  # noqa: F401  (fixtures)
from workers.contract.inputs.jsonfile import read_json_value
from workers.contract.inputs.regular_file import NotARegularFile, open_regular, special_entries
from workers.contract.extraction.tensor_headers import read_safetensors_header

pytestmark = pytest.mark.django_db


def finishes_within(seconds, fn):
    """fn() run on a thread; what it raised or returned, or a failure if it still blocks."""
    outcome = {}

    def call():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc
        finally:
            connection.close()  # this thread's own database connection

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    return outcome


def test_a_fifo_and_a_device_are_not_opened_as_files(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), ("/dev/zero", "a character device")):
        got = finishes_within(5, lambda: open_regular(path))
        assert isinstance(got.get("error"), NotARegularFile) and kind in str(got["error"])
    got = finishes_within(5, lambda: read_json_value(fifo))
    assert "a FIFO (named pipe), not a regular file" in str(got["error"])
    got = finishes_within(5, lambda: read_safetensors_header(fifo))
    assert isinstance(got.get("error"), NotARegularFile)
    regular = tmp_path / "ok.json"
    regular.write_text('{"a": 1}')
    assert read_json_value(regular) == {"a": 1}
    assert special_entries(tmp_path) == ["config.json is a FIFO (named pipe)"]


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_checkpoint_holding_a_fifo_is_refused_at_once_and_nothing_is_stored(placed, name):  # noqa: F811
    ckpt, target = placed
    (ckpt / name).unlink()
    os.mkfifo(ckpt / name)
    got = finishes_within(20, lambda: call_command("import_checkpoint", str(ckpt), "--verifier", str(target),
                                                   "--json", stdout=io.StringIO()))
    assert isinstance(got.get("error"), CommandError)
    assert f"{name} is a FIFO (named pipe)" in str(got["error"])
    assert not Checkpoint.objects.exists()


def test_a_verifier_holding_a_fifo_is_refused(placed):  # noqa: F811
    ckpt, target = placed
    os.mkfifo(target / "tokenizer.json")
    got = finishes_within(20, lambda: call_command("import_checkpoint", str(ckpt), "--verifier", str(target),
                                                   "--json", stdout=io.StringIO()))
    assert "tokenizer.json is a FIFO (named pipe)" in str(got.get("error"))
    assert not Checkpoint.objects.exists()
