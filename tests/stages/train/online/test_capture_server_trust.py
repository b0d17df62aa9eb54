"""A capture server is a stranger (issue 34): a real HTTP server in the test plays a hostile one that answers
/health, /v1/models with the run's target and /v1/completions naming a file it should not (outside the
staging folder, through a symlink inside it, through `..`, or a lock that is a symlink). The train stage's
client refuses the sample naming the server and neither opens nor removes anything outside the staging
folder: the victim file keeps its bytes and is not read (its access time, measured against a control file
read the same way, does not move). A URL the capture host rule refuses is refused before any request."""
from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workers.contract.errors import InputError
from workers.stages.train.online.cache import SampleCache
from workers.stages.train.online.capture import CaptureClient
from workers.stages.train.online.staging import CaptureRefused
from workers.stages.train.online.servers import CaptureFleet

TOKENS = [5, 6, 7]
SECRET = b"the worker's own file: not safetensors, not the server's to name"


class HostileServer:
    """/health, /v1/models (the target's path) and /v1/completions answering `names` as the file."""

    def __init__(self, target_dir: Path):
        self.names: object = ""
        self.requests: list[str] = []
        self.redirect_to: str | None = None
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                owner.requests.append(f"GET {self.path}")
                if owner.redirect_to is not None:
                    self._answer(302, {}, {"Location": owner.redirect_to})
                elif self.path == "/health":
                    self._answer(200, {})
                else:
                    self._answer(200, {"data": [{"id": str(target_dir), "root": str(target_dir)}]})

            def do_POST(self) -> None:
                owner.requests.append(f"POST {self.path}")
                asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._answer(200, {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": asked["model"],
                                   "choices": [{"index": 0, "text": "", "finish_reason": "length",
                                                "prompt_token_ids": asked["prompt"]}],
                                   "kv_transfer_params": {"hidden_states_path": owner.names}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _aged(path: Path, data: bytes) -> Path:
    """A file whose access time lies before its modification time: any read moves it (relatime reads so)."""
    path.write_bytes(data)
    stat = path.stat()
    os.utime(path, ns=(stat.st_mtime_ns - 3_600 * 10**9, stat.st_mtime_ns))
    return path


@pytest.fixture
def world(tmp_path):
    target = tmp_path / "targets" / "tiny-target"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "num_hidden_layers": 4,
        "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 32, "max_position_embeddings": 64}))
    outside = tmp_path / "worker_files"
    outside.mkdir()
    victim = _aged(outside / "precious.safetensors", SECRET)
    victim_lock = _aged(outside / "precious.safetensors.lock", b"lock")
    control = _aged(outside / "control.bin", SECRET)
    control.read_bytes()
    reads_move_atime = control.stat().st_atime_ns >= control.stat().st_mtime_ns
    staging = tmp_path / "capture_staging"
    with HostileServer(target) as server:
        yield {"server": server, "target": target, "victim": victim, "victim_lock": victim_lock, "tmp": tmp_path,
               "staging": staging, "reads_move_atime": reads_move_atime}


def _fleet(world, *, urls=None, allowed=("127.0.0.1",)) -> CaptureFleet:
    return CaptureFleet(target_dir=world["target"], layer_ids=[0, 1, 2], count=0,
                        urls=urls or [world["server"].url], work_dir=world["tmp"] / "run" / "servers",
                        max_model_len=64, allowed_hosts=allowed, url_staging=world["staging"])


def _untouched(world) -> None:
    for path, data in ((world["victim"], SECRET), (world["victim_lock"], b"lock")):
        stat = path.stat()  # before this test's own read below
        if world["reads_move_atime"]:  # measurable here: a read would have moved it past the mtime
            assert stat.st_atime_ns < stat.st_mtime_ns, f"{path.name} was read"
        assert path.read_bytes() == data


@pytest.mark.parametrize("spelling", ["outside", "symlink_inside", "dotdot", "lock_symlink"])
def test_a_file_the_server_names_outside_its_staging_folder_is_neither_opened_nor_removed(world, spelling):
    server, staging, victim = world["server"], world["staging"], world["victim"]
    with _fleet(world) as fleet:
        if spelling == "outside":
            server.names = str(victim)
        elif spelling == "symlink_inside":
            (staging / "row0.safetensors").symlink_to(victim)
            server.names = str(staging / "row0.safetensors")
        elif spelling == "dotdot":
            server.names = f"{staging}/../worker_files/{victim.name}"
        else:  # a plain file inside, whose .lock leads outside: the lock is not opened nor removed either
            (staging / "row0.safetensors").write_bytes(b"not read either")
            (staging / "row0.safetensors.lock").symlink_to(world["victim_lock"])
            server.names = str(staging / "row0.safetensors")
        client = CaptureClient(fleet, SampleCache(world["tmp"] / "cache", limit_bytes=2**20), layer_ids=[0, 1, 2],
                               hidden_size=8, num_hidden_layers=4, request_timeout_s=10)
        with pytest.raises(CaptureRefused) as refused:
            client.capture(0, TOKENS)
    assert f"capture server {server.url}" in str(refused.value)
    assert "POST /v1/completions" in server.requests
    _untouched(world)
    if spelling == "symlink_inside":
        assert (staging / "row0.safetensors").is_symlink()  # the link is left, its target too
    assert not list((world["tmp"] / "cache").glob("hs_*"))


def test_what_the_server_answers_reaches_the_error_only_as_a_bounded_escaped_excerpt(world):
    server = world["server"]
    server.names = "\n<script>" + "x" * 5000
    with _fleet(world) as fleet:
        client = CaptureClient(fleet, SampleCache(world["tmp"] / "cache", limit_bytes=2**20), layer_ids=[0, 1, 2],
                               hidden_size=8, num_hidden_layers=4, request_timeout_s=10)
        with pytest.raises(CaptureRefused) as refused:
            client.capture(0, TOKENS)
    said = str(refused.value)
    assert "\n" not in said and "'\\n<script>xxx" in said and "(+4809 characters)" in said and len(said) < 800


@pytest.mark.parametrize(("url", "words"), [
    ("http://2130706433:{port}", "is an address in an unusual spelling"),
    ("http://0x7f000001:{port}", "is an address in an unusual spelling"),
    ("http://127.1:{port}", "is an address in an unusual spelling"),
    ("http://169.254.169.254:{port}", "capture server host '169.254.169.254' is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"),
    ("http://localhost:{port}", "capture server host 'localhost' is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"),
])
def test_a_url_the_host_rule_refuses_gets_no_request_at_use_time(world, url, words):
    port = world["server"].url.rsplit(":", 1)[1]
    with pytest.raises(InputError) as refused, _fleet(world, urls=[url.format(port=port)]):
        pass
    assert str(refused.value).startswith("capture_urls: ") and words in str(refused.value)
    assert world["server"].requests == []


def test_loopback_is_refused_unless_listed_and_a_listed_name_must_resolve_to_listed_addresses(world):
    with pytest.raises(InputError, match="'127.0.0.1' is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"):
        _fleet(world, allowed=()).__enter__()
    port = world["server"].url.rsplit(":", 1)[1]
    with pytest.raises(InputError, match="resolves to 127.0.0.1, a loopback, private or link-local address"):
        _fleet(world, urls=[f"http://localhost:{port}"], allowed=("localhost",)).__enter__()
    assert world["server"].requests == []


def test_a_redirect_is_not_followed(world):
    elsewhere = HostileServer(world["target"])
    with elsewhere:
        world["server"].redirect_to = f"{elsewhere.url}/health"
        with pytest.raises(Exception, match="does not answer GET /health"), _fleet(world):
            pass
    assert world["server"].requests == ["GET /health"] and elsewhere.requests == []


def test_a_file_inside_the_staging_folder_is_taken_checked_and_cached(world):
    """The other side: a stamped sample the server wrote into its staging folder, under a lock it holds for
    a moment, is waited for, moved out, checked and cached; staging keeps neither the file nor its lock."""
    import fcntl

    import torch
    from safetensors.torch import save_file

    server, staging = world["server"], world["staging"]
    with _fleet(world) as fleet:
        written = staging / "cmpl-1-0.safetensors"
        save_file({"hidden_states": torch.ones(len(TOKENS), 3, 8, dtype=torch.bfloat16),
                   "token_ids": torch.tensor(TOKENS, dtype=torch.int64)}, str(written),
                  metadata={"eagle3web_layer_ids": "[0, 1, 2]", "eagle3web_model": "tiny",
                            "eagle3web_hidden_size": "8", "eagle3web_num_hidden_layers": "4"})
        lock = os.open(f"{written}.lock", os.O_CREAT | os.O_WRONLY, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX)
        threading.Timer(0.3, os.close, args=(lock,)).start()  # the writer lets go a moment later
        server.names = str(written)
        cache = SampleCache(world["tmp"] / "cache", limit_bytes=2**20)
        client = CaptureClient(fleet, cache, layer_ids=[0, 1, 2], hidden_size=8, num_hidden_layers=4,
                               request_timeout_s=10)
        started = time.perf_counter()
        captured = client.capture(0, TOKENS)
    assert captured.server == server.url and time.perf_counter() - started >= 0.25
    assert sorted(p.name for p in staging.iterdir()) == []
    from safetensors.torch import load_file

    assert load_file(str(world["tmp"] / "cache" / "hs_0.safetensors"))["token_ids"].tolist() == TOKENS
    _untouched(world)


def test_speculators_own_trainer_is_kept_to_the_staging_folder_too(world):
    """speculators' FileTransfer, in a process set up as the torchrun entry sets it up (with_speculators.confine,
    from its environment variable): a file named outside the staging folder is refused naming the server and
    its delete removes nothing the server named; one inside is read and gone from staging."""
    import subprocess
    import sys

    import torch
    from safetensors.torch import save_file

    from workers.stages.train.with_speculators.confine import CONFINE_ENV, confine_spec

    staging = world["staging"]
    staging.mkdir()
    inside = staging / "cmpl-2-0.safetensors"
    save_file({"hidden_states": torch.ones(2, 3, 8, dtype=torch.bfloat16), "token_ids": torch.tensor([1, 2])},
              str(inside))
    script = f"""
from workers.stages.train.with_speculators.confine import install_from_environment
install_from_environment()
from hs_connectors.transfer import FileTransfer
files = FileTransfer(None)
try:
    files.get_generated({{"hidden_states_path": {str(world["victim"])!r}}})
    print("READ")
except Exception as exc:
    print(type(exc).__name__, str(exc))
files.delete({str(world["victim"])!r})
print(files.get_generated({{"hidden_states_path": {str(inside)!r}}})["token_ids"].tolist())
"""
    env = {**os.environ, CONFINE_ENV: confine_spec(staging=staging, taken=world["tmp"] / "taken", server="http://cap:1"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[4])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, out.stderr[-2000:]
    assert lines[0].startswith("CaptureRefused capture server http://cap:1 named ") and "outside" in lines[0]
    assert lines[1] == "[1, 2]" and not inside.exists()
    _untouched(world)
