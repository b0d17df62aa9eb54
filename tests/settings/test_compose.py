"""docker-compose.yml, Dockerfile.gpu and .env.example, and the containers' entrypoints run outside
Docker (no Docker engine runs on the development machines): the web command and the workers'
health check, taken from the compose file itself. The file is loaded by Compose itself (`config`: its
schema, its ${...} interpolation, the x-app anchor merged), never skipped: `make compose-deps` installs
Debian's docker-compose where the Docker CLI has no compose plugin, and CI runs it."""
import http.client
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml  # PyYAML: transformers and datasets require it

from tests.settings.test_deploy import DEPLOYED, KEY, _env, _free_port

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)
APP_SERVICES = ("web", "worker-cpu", "worker-gpu")


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _interpolate(text: str, env: dict) -> str:
    """What compose makes of ${VAR:-default} and $$ (the forms docker-compose.yml uses)."""
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), text)
    return text.replace("$$", "$")


def _env_example_names() -> set[str]:
    return set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)


# --- the file --------------------------------------------------------------------------------------

def test_compose_gives_every_service_a_healthcheck(compose):
    assert set(compose["services"]) == {"postgres", "redis", "web", "worker-cpu", "worker-gpu"}
    missing = [name for name, service in compose["services"].items() if not service.get("healthcheck", {}).get("test")]
    assert missing == []


def test_compose_web_collects_migrates_and_runs_gunicorn(compose):
    command = compose["services"]["web"]["command"]
    assert command.index("collectstatic") < command.index("migrate") < command.index("exec gunicorn eagle3web.wsgi")
    assert "runserver" not in command


def test_compose_redis_persists_to_a_volume(compose):
    redis = compose["services"]["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert "redisdata:/data" in redis["volumes"]


def test_compose_runs_the_app_deployed(compose):
    for name in APP_SERVICES:
        environment = compose["services"][name]["environment"]
        assert environment["DJANGO_DEBUG"] == "0"
        assert environment["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")


def test_compose_mounts_the_data_root_at_the_same_path_in_every_app_container(compose):
    for name in APP_SERVICES:
        service = compose["services"][name]
        assert "${DATA_DIR:-./data}:/data" in service["volumes"]
        assert service["environment"]["EAGLE3WEB_DATA_DIR"] == "/data"
        assert service["environment"]["EAGLE3WEB_DATA_ROOTS"] == "/data:/models"


def test_compose_workers_answer_a_ping_as_health(compose):
    for name in ("worker-cpu", "worker-gpu"):
        assert "inspect ping -d celery@$$HOSTNAME" in compose["services"][name]["healthcheck"]["test"][1]


def test_compose_gpu_worker_reserves_nvidia_gpus_in_the_vllm_image(compose):
    gpu = compose["services"]["worker-gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "${GPU_COUNT:-1}", "capabilities": ["gpu"]}]
    assert gpu["build"] == {"context": ".", "dockerfile": "Dockerfile.gpu"}
    assert gpu["shm_size"] == "${GPU_SHM_SIZE:-16gb}"
    assert gpu["command"] == "celery -A eagle3web worker --loglevel INFO --concurrency 1"
    dockerfile = (ROOT / "Dockerfile.gpu").read_text()
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v\d+\.\d+\.\d+$", dockerfile, re.M)
    # The image's CUDA torch is kept: requirements.txt goes in without its torch pin, under the image's.
    assert "grep -viE '^(torch|numpy)==' requirements.txt" in dockerfile
    assert "-c /tmp/image-pins.txt -r /tmp/requirements-gpu.txt" in dockerfile


def test_compose_only_gpu_worker_reserves_gpus(compose):
    others = [name for name, service in compose["services"].items()
              if name != "worker-gpu" and "deploy" in service]
    assert others == []


def test_every_compose_variable_is_in_env_example():
    used = set(re.findall(r"(?<!\$)\$\{(\w+)", (ROOT / "docker-compose.yml").read_text()))
    assert used, "docker-compose.yml names no variable"
    assert sorted(used - _env_example_names()) == []


def test_every_variable_the_settings_read_is_in_env_example():
    read = set(re.findall(r"env_\w+\(\s*\"(\w+)\"", (ROOT / "eagle3web" / "settings.py").read_text()))
    assert {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY"} <= read
    assert sorted(read - _env_example_names()) == []


def test_every_app_setting_in_env_example_reaches_the_containers(compose):
    """.env only feeds compose's ${...}: a setting the containers should read must be passed on."""
    settings_vars = set(re.findall(r"env_\w+\(\s*\"(\w+)\"", (ROOT / "eagle3web" / "settings.py").read_text()))
    for name in APP_SERVICES:
        environment = compose["services"][name]["environment"]
        # EAGLE3WEB_RUNS_DIR follows EAGLE3WEB_DATA_DIR (/data/runs) unless set.
        assert sorted(settings_vars - set(environment) - {"EAGLE3WEB_RUNS_DIR"}) == []


def _compose_cli() -> list[str]:
    """Compose itself: the Docker CLI's plugin where there is one, else Debian's docker-compose (1.29.2,
    which `make compose-deps` installs and CI runs). Missing, the test fails: the docs say the compose
    file is checked, so a machine that cannot check it must not pass quietly."""
    for cli in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cli[0]) and subprocess.run([*cli, "version"], capture_output=True).returncode == 0:
            return cli
    pytest.fail("neither `docker compose` nor `docker-compose` is installed: run `make compose-deps` "
                "(Debian's docker-compose), as .ci/run does")


def _compose_config(tmp_path, compose_file: Path = ROOT / "docker-compose.yml", **env) -> subprocess.CompletedProcess:
    """`config` of the file, as Compose loads it: its schema checked, ${...} interpolated. Only `env` and
    PATH in the environment, and an empty env file, so that no .env or shell variable of this machine
    stands in for a default."""
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    return subprocess.run([*_compose_cli(), "--env-file", str(env_file), "-f", str(compose_file), "config"],
                          cwd=compose_file.parent, capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env})


def _words(value: str | list) -> str:
    # Compose 1 writes a command back as the string it was; Compose 2 splits it into words.
    return value if isinstance(value, str) else " ".join(value)


def test_compose_loads_the_file_and_interpolates_it_as_compose_does(tmp_path):
    loaded = _compose_config(tmp_path, DJANGO_SECRET_KEY=KEY, GPU_COUNT="2", WEB_CONCURRENCY="5")
    assert loaded.returncode == 0, loaded.stderr
    resolved = yaml.safe_load(loaded.stdout)
    services = resolved["services"]
    assert set(services) == {"postgres", "redis", "web", "worker-cpu", "worker-gpu"}
    for name in APP_SERVICES:  # the x-app anchor merged into each, ${VAR:-default} resolved, ${VAR:?} set
        environment = services[name]["environment"]
        assert environment["DATABASE_URL"] == "postgres://eagle3web:eagle3web@postgres:5432/eagle3web"
        assert environment["CELERY_BROKER_URL"] == "redis://redis:6379/0"
        assert environment["DJANGO_SECRET_KEY"] == KEY and environment["DJANGO_DEBUG"] == "0"
        assert environment["DJANGO_CSRF_TRUSTED_ORIGINS"] in ("", None)  # ${...:-} is empty
    assert "--workers 5 " in _words(services["web"]["command"])
    gpu = services["worker-gpu"]
    assert str(gpu["deploy"]["resources"]["reservations"]["devices"][0]["count"]) == "2"  # from the environment
    assert gpu["shm_size"] in ("16gb", 16 * 2**30, "17179869184")  # the default, as the Compose at hand writes it
    assert gpu["hostname"] == "worker-gpu" and services["worker-cpu"]["hostname"] == "worker-cpu"
    # $$ is a literal $ for the container's shell: left to it (written back escaped), not interpolated.
    assert re.search(r"celery@\$\$?HOSTNAME ", _words(gpu["healthcheck"]["test"]))


def test_compose_refuses_to_run_without_a_secret_key_naming_it(tmp_path):
    refused = _compose_config(tmp_path)
    assert refused.returncode != 0
    assert "set DJANGO_SECRET_KEY (see .env.example)" in refused.stderr, refused.stderr


def test_compose_refuses_a_misspelled_option_so_its_check_is_real(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    text = (ROOT / "docker-compose.yml").read_text()
    assert "    shm_size: " in text
    broken.write_text(text.replace("    shm_size: ", "    shm_sise: "))
    refused = _compose_config(tmp_path, broken, DJANGO_SECRET_KEY=KEY)
    assert refused.returncode != 0 and "shm_sise" in refused.stderr, refused.stderr


# --- the entrypoints, outside Docker ---------------------------------------------------------------

def test_web_command_migrates_collects_and_serves_the_login_page(compose, tmp_path):
    port = _free_port()
    env = _env(tmp_path, **DEPLOYED, DJANGO_BEHIND_TLS_PROXY="1", DJANGO_STATIC_ROOT=str(tmp_path / "static"),
               WEB_CONCURRENCY="1", PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    command = _interpolate(compose["services"]["web"]["command"], env).replace("0.0.0.0:8000", f"127.0.0.1:{port}")
    log = tmp_path / "web.log"
    with log.open("w") as out:
        server = subprocess.Popen(shlex.split(command), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, server, log, seconds=120)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/login/", headers={"Host": "eagle3.example.com", "X-Forwarded-Proto": "https"})
        response = conn.getresponse()
        assert response.status == 200, log.read_text()
        assert b'name="password"' in response.read()
        assert (tmp_path / "static" / "staticfiles.json").is_file()  # collectstatic ran, with its manifest
        assert (tmp_path / "db.sqlite3").stat().st_size > 0  # migrate ran
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_worker_health_check_passes_while_the_worker_runs_and_fails_after(compose, tmp_path):
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not broker.startswith("redis://"):
        pytest.skip("needs the test Redis (make test sets CELERY_BROKER_URL)")
    hostname = f"compose-check-{os.getpid()}"
    env = _env(tmp_path, **DEPLOYED, CELERY_BROKER_URL=broker, HOSTNAME=hostname, EAGLE3WEB_DATA_ROOTS=str(tmp_path),
               PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert migrate.returncode == 0, migrate.stderr
    # The container's hostname is the node name compose's check pings: -n stands in for it here.
    worker_cmd = shlex.split(compose["services"]["worker-cpu"]["command"]) + ["-n", f"celery@{hostname}"]
    health = ["sh", "-c", _interpolate(compose["services"]["worker-cpu"]["healthcheck"]["test"][1], env)]
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(worker_cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "ready." not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        alive = subprocess.run(health, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert alive.returncode == 0, alive.stdout + alive.stderr
        assert f"celery@{hostname}: OK" in alive.stdout
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(timeout=60)
    gone = subprocess.run(health, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert gone.returncode != 0
