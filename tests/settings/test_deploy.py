"""Deployment settings, read in a fresh process each time (settings are read at import), and gunicorn
with WhiteNoise. DJANGO_DEBUG unset is local; DJANGO_DEBUG=0 is deployed (see eagle3web/settings.py).
docker-compose.yml is tests/settings/test_compose.py's."""
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEY = secrets.token_urlsafe(50)  # 67 characters, as `check --deploy` wants (50+, varied)
DEPLOYED = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": KEY, "DJANGO_ALLOWED_HOSTS": "eagle3.example.com"}
HTTPS_SETTINGS = ["SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS",
                  "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD"]


def _env(tmp_path, **overrides):
    """This process's environment without any app variable, plus an SQLite file and data dir in tmp."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EAGLE3WEB_", "DJANGO_", "CELERY_")) and k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="eagle3web.settings", EAGLE3WEB_DATA_DIR=str(tmp_path / "data"),
               DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    env.update(overrides)
    return env


def _run(tmp_path, args, **env):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=60)


def _settings(tmp_path, **env):
    """The named settings as a fresh process reads them from `env`."""
    names = HTTPS_SETTINGS + ["DEBUG", "SECRET_KEY", "SECURE_PROXY_SSL_HEADER", "CSRF_TRUSTED_ORIGINS"]
    code = ("import json; from django.conf import settings as s; "
            f"print(json.dumps({{n: getattr(s, n) for n in {names!r}}}))")
    proc = _run(tmp_path, ["-c", code], **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# --- the secret-key rule ---------------------------------------------------------------------------

def test_deployed_without_secret_key_refuses_to_start(tmp_path):
    proc = _run(tmp_path, ["manage.py", "check"], DJANGO_DEBUG="0", DJANGO_ALLOWED_HOSTS="eagle3.example.com")
    assert proc.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in proc.stderr


def test_deployed_with_empty_secret_key_refuses_to_start(tmp_path):
    proc = _run(tmp_path, ["manage.py", "check"], DJANGO_DEBUG="false", DJANGO_SECRET_KEY="")
    assert proc.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in proc.stderr


def test_local_without_debug_variable_starts_with_builtin_key_over_plain_http(tmp_path):
    values = _settings(tmp_path)
    assert values["DEBUG"] is False
    assert values["SECRET_KEY"].startswith("eagle3web-insecure-local-key")
    assert {name: values[name] for name in HTTPS_SETTINGS} == dict.fromkeys(HTTPS_SETTINGS, False) | {
        "SECURE_HSTS_SECONDS": 0}


def test_debug_on_starts_with_builtin_key(tmp_path):
    values = _settings(tmp_path, DJANGO_DEBUG="1")
    assert values["DEBUG"] is True
    assert values["SECRET_KEY"].startswith("eagle3web-insecure-local-key")


# --- HTTPS defaults when deployed ------------------------------------------------------------------

def test_check_deploy_is_clean_with_debug_key_and_hosts_only(tmp_path):
    proc = _run(tmp_path, ["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **DEPLOYED)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "System check identified no issues" in proc.stdout


def test_deployed_turns_https_settings_on(tmp_path):
    values = _settings(tmp_path, **DEPLOYED)
    assert values["SECRET_KEY"] == KEY
    assert {name: values[name] for name in HTTPS_SETTINGS} == dict.fromkeys(HTTPS_SETTINGS, True) | {
        "SECURE_HSTS_SECONDS": 31536000}
    assert values["SECURE_PROXY_SSL_HEADER"] is None


@pytest.mark.parametrize("variable, setting, off", [
    ("DJANGO_SESSION_COOKIE_SECURE", "SESSION_COOKIE_SECURE", False),
    ("DJANGO_CSRF_COOKIE_SECURE", "CSRF_COOKIE_SECURE", False),
    ("DJANGO_SECURE_SSL_REDIRECT", "SECURE_SSL_REDIRECT", False),
    ("DJANGO_SECURE_HSTS_SECONDS", "SECURE_HSTS_SECONDS", 0),
    ("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", False),
    ("DJANGO_SECURE_HSTS_PRELOAD", "SECURE_HSTS_PRELOAD", False),
])
def test_each_https_default_can_be_turned_off(tmp_path, variable, setting, off):
    values = _settings(tmp_path, **DEPLOYED, **{variable: "0"})
    assert values[setting] == off
    assert all(values[other] for other in HTTPS_SETTINGS if other != setting)


def test_bad_boolean_stops_start_naming_the_variable(tmp_path):
    proc = _run(tmp_path, ["manage.py", "check"], **DEPLOYED, DJANGO_SECURE_SSL_REDIRECT="sometimes")
    assert proc.returncode != 0
    assert "DJANGO_SECURE_SSL_REDIRECT='sometimes' is not a boolean" in proc.stderr


def test_behind_tls_proxy_trusts_forwarded_proto(tmp_path):
    values = _settings(tmp_path, **DEPLOYED, DJANGO_BEHIND_TLS_PROXY="1")
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_csrf_trusted_origins_read_as_a_list(tmp_path):
    values = _settings(tmp_path, **DEPLOYED,
                       DJANGO_CSRF_TRUSTED_ORIGINS="https://eagle3.example.com, https://eagle3.internal:8443")
    assert values["CSRF_TRUSTED_ORIGINS"] == ["https://eagle3.example.com", "https://eagle3.internal:8443"]


# --- gunicorn + WhiteNoise, deployed ---------------------------------------------------------------

def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(port, path, proto="https"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": "eagle3.example.com", "X-Forwarded-Proto": proto})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def gunicorn_server(tmp_path_factory):
    """gunicorn on a free port, deployed behind a (pretend) TLS proxy, with collected static files."""
    tmp_path = tmp_path_factory.mktemp("gunicorn")
    env = {**DEPLOYED, "DJANGO_BEHIND_TLS_PROXY": "1", "DJANGO_STATIC_ROOT": str(tmp_path / "static")}
    for args in (["manage.py", "migrate", "--noinput", "-v", "0"],
                 ["manage.py", "collectstatic", "--noinput", "-v", "0"]):
        proc = _run(tmp_path, args, **env)
        assert proc.returncode == 0, proc.stderr
    port = _free_port()
    log = open(tmp_path / "gunicorn.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "eagle3web.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1",
         "--no-control-socket"], cwd=ROOT, env=_env(tmp_path, **env), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "gunicorn.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "gunicorn.log").read_text()
                time.sleep(0.1)
        server.port = port
        server.env = _env(tmp_path, **env)
        yield server
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def test_gunicorn_serves_the_login_page(gunicorn_server):
    status, _, body = _get(gunicorn_server.port, "/login/")
    assert status == 200
    assert b'name="password"' in body


def test_gunicorn_redirects_plain_http_to_https(gunicorn_server):
    status, headers, _ = _get(gunicorn_server.port, "/login/", proto="http")
    assert status == 301
    assert headers["Location"] == "https://eagle3.example.com/login/"


def test_whitenoise_serves_collected_static_file(gunicorn_server):
    status, _, body = _get(gunicorn_server.port, "/static/css/app.css")
    assert status == 200
    assert body == (ROOT / "static" / "css" / "app.css").read_bytes()


def test_login_page_links_hashed_static_files_cached_for_good(gunicorn_server):
    _, _, page = _get(gunicorn_server.port, "/login/")
    start = page.index(b"/static/css/app.")
    url = page[start:page.index(b'"', start)].decode()
    assert url != "/static/css/app.css"  # the manifest's hashed name
    status, headers, _ = _get(gunicorn_server.port, url)
    assert status == 200
    assert "immutable" in headers["Cache-Control"]


def test_container_healthcheck_passes_against_gunicorn(gunicorn_server):
    proc = subprocess.run([sys.executable, "deploy/healthcheck.py", str(gunicorn_server.port)], cwd=ROOT,
                          env=gunicorn_server.env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "200 /login/"


def test_container_healthcheck_fails_without_server(tmp_path):
    proc = subprocess.run([sys.executable, "deploy/healthcheck.py", str(_free_port())], cwd=ROOT,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "no answer" in proc.stdout
