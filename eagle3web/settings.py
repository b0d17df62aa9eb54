"""Settings from the environment. With nothing set: SQLite and a file-system Celery broker under
./data, so that `make demo` needs no server. DATABASE_URL and CELERY_BROKER_URL pick PostgreSQL
and Redis."""
from __future__ import annotations

import os
import re
import shlex
import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from eagle3web.env import env_bool, env_int, env_list, env_paths, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("EAGLE3WEB_DATA_DIR", str(BASE_DIR / "data"))).resolve()

# Two modes, told apart by DJANGO_DEBUG alone:
# - DJANGO_DEBUG unset (`make demo`, `make test`, a shell): local. DEBUG is off, the built-in
#   insecure key is used unless DJANGO_SECRET_KEY is set, and the HTTPS settings below are off
#   (runserver speaks plain HTTP).
# - DJANGO_DEBUG set to a false word (0/false/no/off): deployed. DJANGO_SECRET_KEY must be set
#   (start-up stops otherwise) and the HTTPS settings below default on, each overridable.
# DJANGO_DEBUG=1 is local development with Django's debug pages; never on a reachable host.
DEBUG = env_bool("DJANGO_DEBUG", False)
DEPLOYED = os.environ.get("DJANGO_DEBUG") is not None and not DEBUG
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if DEPLOYED:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set: with DJANGO_DEBUG=0 the app needs a secret key of its own "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    SECRET_KEY = "eagle3web-insecure-local-key-set-DJANGO_SECRET_KEY-in-production"
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
# Origins (scheme included, e.g. https://eagle3.example.com) allowed to POST forms from another
# host or port than the one the request names, e.g. behind a proxy that rewrites Host.
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# Sign-in sessions are rows in PostgreSQL, as Django's `db` engine keeps them (signing out deletes the row: the
# session ends at once in every process), read in one precompiled statement (runs.api.account.sessions).
SESSION_ENGINE = "runs.api.account.sessions"

# HTTPS: on by default when deployed, off locally; each can be set either way.
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", DEPLOYED)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", DEPLOYED)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", DEPLOYED)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31536000 if DEPLOYED else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", DEPLOYED)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", DEPLOYED)
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto (and strips it from clients), Django
# must trust that header to know a request came over HTTPS; otherwise SECURE_SSL_REDIRECT loops.
if env_bool("DJANGO_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "axes",
    "runs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Outside the rest, so that answers they make themselves (a CSRF refusal, a login redirect) carry it too.
    "eagle3web.security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Before anything reads the session, the user or a form: a NUL or a lone surrogate anywhere in a request
    # is a 400 naming the field (eagle3web/storable_text.py), never a query PostgreSQL fails on.
    "eagle3web.unstorable_input.UnstorableTextMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as axes asks: turns a sign-in the throttle refused into its lockout answer (eagle3web.login_throttle).
    "axes.middleware.AxesMiddleware",
]

# Pages escape what they show of data (templates autoescape; static/js/shared/dom.js builds elements from
# text); this policy is the second line: were a string ever to reach a page as HTML, the browser would
# run no script but our static files, load nothing from elsewhere and let no other site frame the page.
# Every page's scripts and styles are files under static/ (plotly.js included): no inline <script>, no
# on*="" handler, no style="" attribute or <style> block (static/js/shared/page.js does what those did). Styles
# a script sets through CSSOM (an element's style object, plotly's rules inserted into app.css's sheet:
# see base.html) are not inline styles to CSP, so style-src needs no 'unsafe-inline'. 'unsafe-eval':
# plotly's WebGL traces (scattergl curves, the sweep's parallel coordinates) compile their draw calls
# with Function (regl); it lets no injected markup run, which is what inline script would. data: images:
# plotly's "download plot as png". Sent locally too (the browser tests then run every page under it) and
# when deployed; not with DJANGO_DEBUG=1, whose error pages are inline script and style.
CONTENT_SECURITY_POLICY = "" if DEBUG else "; ".join([
    "default-src 'self'", "script-src 'self' 'unsafe-eval'", "style-src 'self'", "img-src 'self' data:",
    "object-src 'none'", "base-uri 'self'", "form-action 'self'", "frame-ancestors 'none'",
])

ROOT_URLCONF = "eagle3web.urls"
WSGI_APPLICATION = "eagle3web.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "runs.alerts.context.alerts_unread",  # the bell in the nav
            ],
        },
    },
]

# Seconds a process keeps its database connection between requests (0: a new one per request).
# Compose sets 60: a gunicorn sync worker then reuses one connection, checked before reuse. Celery
# workers hold theirs whatever this says, and reconnect on their own after an outage (workers.orchestration.tasks).
DATABASE_CONN_MAX_AGE = env_int("DATABASE_CONN_MAX_AGE", 0)
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'eagle3web.sqlite3'}"),
        conn_max_age=DATABASE_CONN_MAX_AGE, conn_health_checks=DATABASE_CONN_MAX_AGE > 0,
    )
}
# The statements compiled once a process (eagle3web.db.compile_query: the session, the user, the runs list's rows)
# are prepared on PostgreSQL, planned once a connection instead of every request. Off behind a pooler that
# hands a session's statements to other connections (pgbouncer in transaction mode before 1.21).
DATABASE_PREPARED_STATEMENTS = env_bool("DATABASE_PREPARED_STATEMENTS", True)
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # Several writers at once (the web server, the demo's two workers): WAL lets readers go on beside
    # the one writer; a writer waits up to 30 s for the lock (the busy timeout) instead of failing;
    # IMMEDIATE takes the write lock when a transaction begins, because one that read first and
    # writes later cannot wait for it (SQLite answers "database is locked" at once, timeout or not).
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE",
                                       "init_command": "PRAGMA journal_mode=WAL;"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# What live pages share (runs.live): each web process's own memory. Keys carry the data's change
# counters, so no entry is ever stale and none needs invalidating across processes; at most 200
# answers of at most 1 MiB each (runs.live.MAX_CACHED_BYTES) per process.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "eagle3web-live",
                      "OPTIONS": {"MAX_ENTRIES": 200}}}

# Sign-in throttling (django-axes; eagle3web/login_throttle.py) for the login page and the admin's: failed
# attempts are database rows, so every web process counts together and Redis being away changes nothing.
# Locked: EAGLE3WEB_LOGIN_FAILURES_PER_NAME failures for one name from one address, or
# EAGLE3WEB_LOGIN_FAILURES_PER_ADDRESS from one address, within EAGLE3WEB_LOGIN_COOLOFF_MINUTES; locked
# until that long after the last failure (failures while locked do not extend it), right password or not.
# The password check and the signed-in user's read: Django's ModelBackend, its read compiled once (runs.api.account.sessions).
AUTHENTICATION_BACKENDS = ["eagle3web.login_throttle.LoginThrottleBackend", "runs.api.account.sessions.UserBackend"]
AXES_FAILURE_LIMIT = env_int("EAGLE3WEB_LOGIN_FAILURES_PER_NAME", 10)
EAGLE3WEB_LOGIN_FAILURES_PER_ADDRESS = env_int("EAGLE3WEB_LOGIN_FAILURES_PER_ADDRESS", 30)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("EAGLE3WEB_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["ip_address", "username"], "ip_address"]  # the order LoginThrottleHandler reads
AXES_HANDLER = "eagle3web.login_throttle.LoginThrottleHandler"
AXES_CLIENT_IP_CALLABLE = "eagle3web.login_throttle.client_address"
AXES_LOCKOUT_CALLABLE = "eagle3web.login_throttle.lockout_response"
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # successful sign-ins need no row each; failures are what is throttled
# The largest body Django reads (the API answers 413 past it): a batch of 10,000 metric points at its
# widest (50-character keys, 17-digit values) is 1.5 MB, 2.3 MB indented by 4; room to spare for that.
DATA_UPLOAD_MAX_MEMORY_SIZE = 8 * 1024 * 1024

AUTH_PASSWORD_VALIDATORS = [{"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"}]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs:run_list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
USE_THOUSAND_SEPARATOR = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves straight from the app's static folders (no collectstatic step for the demo);
# deployments that collect set DJANGO_STATIC_ROOT, and then serve the collected files with hashed,
# compressed names (cached for good by browsers). Pages fail until collectstatic ran there.
STATIC_ROOT = env_str("DJANGO_STATIC_ROOT", "") or None
WHITENOISE_USE_FINDERS = STATIC_ROOT is None
if STATIC_ROOT is not None:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

# Every path a user types must resolve under one of these.
EAGLE3WEB_DATA_ROOTS = env_paths("EAGLE3WEB_DATA_ROOTS", [DATA_DIR])
# Where stage outputs of each run are written.
EAGLE3WEB_RUNS_DIR = Path(env_str("EAGLE3WEB_RUNS_DIR", str(DATA_DIR / "runs"))).resolve()
# How often (seconds) a stage may write progress to the database.
EAGLE3WEB_PROGRESS_INTERVAL = env_int("EAGLE3WEB_PROGRESS_INTERVAL", 2)
# How often (seconds) a worker samples CPU, memory, GPU and disk while it runs a run's stage
# (workers.orchestration.system_metrics): each sample becomes a point of the run's "system/..." series.
EAGLE3WEB_SYSTEM_SAMPLE_SECONDS = env_int("EAGLE3WEB_SYSTEM_SAMPLE_SECONDS", 5)
# Threads torch may use in a worker's stage; set explicitly because torch's default oversubscribes
# a machine shared with the web process and other workers.
EAGLE3WEB_TORCH_THREADS = env_int("EAGLE3WEB_TORCH_THREADS", os.cpu_count() or 1)
# A running stage's worker renews its lease every third of this; a stage whose lease lapsed lost its
# worker and is queued again (at most 3 attempts) by the reconciler every worker runs.
EAGLE3WEB_STAGE_LEASE_SECONDS = env_int("EAGLE3WEB_STAGE_LEASE_SECONDS", 60)
# A training across nodes (train_nodes > 1) waits this long for every rank's worker to join, holding no GPU
# meanwhile; then it fails naming the missing ranks. torchrun's own rendezvous gets the same join_timeout.
EAGLE3WEB_TRAIN_GANG_TIMEOUT_SECONDS = env_int("EAGLE3WEB_TRAIN_GANG_TIMEOUT_SECONDS", 300)
# How long a launch waits for vLLM's own config classes to accept the run's speculative config, where vLLM is
# installed beside the web process (runs.pipeline.launch.preflight); 0 turns the check off.
EAGLE3WEB_VLLM_PREFLIGHT_SECONDS = env_int("EAGLE3WEB_VLLM_PREFLIGHT_SECONDS", 60)
# The evaluate stage measures τ for every k from 1 to a draft's trained steps plus this many (at most 16;
# workers.stages.evaluate.k_table); below 0, no k table.
EAGLE3WEB_K_BEYOND_TRAINED = env_int("EAGLE3WEB_K_BEYOND_TRAINED", 2)
# Padded tokens per extraction forward; 0: the default measured for the device
# (workers.stages.extract.with_transformers).
# Lower it when a large target's activations do not fit the accelerator beside its weights.
EAGLE3WEB_EXTRACT_BATCH_TOKENS = env_int("EAGLE3WEB_EXTRACT_BATCH_TOKENS", 0)
# Flags this worker adds to every run of speculators' trainer, as a shell would split them
# (e.g. "--num-workers 8 --optimizer adamw"); runs choose the trainer, the host knows its kernels.
EAGLE3WEB_SPECULATORS_ARGS = shlex.split(env_str("EAGLE3WEB_SPECULATORS_ARGS", ""))
# A worker on a host with GPUs also consumes "gpu" and the queues of the backends and GPU counts it
# can run (workers/orchestration/fleet.py); 0: only the queues given with -Q.
EAGLE3WEB_WORKER_GPU_QUEUES = env_bool("EAGLE3WEB_WORKER_GPU_QUEUES", True)
# Alerts (runs.alerts): webhook hosts (names, addresses or networks, comma-separated) alerts may be
# posted to; a listed name that resolves to a loopback, private or link-local address is refused unless
# that address is listed too. Empty: no webhooks. A failed delivery is tried again after this many
# seconds, doubling each time (6 attempts).
EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS = env_list("EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS", [])
# Capture servers an online run may reach by URL (capture_urls) follow the same rule: host names,
# addresses or networks; loopback, private, link-local and metadata addresses only when listed. Empty: no
# capture URL (capture servers the train stage starts itself need no entry). Such a server writes its
# hidden states into its own folder under EAGLE3WEB_CAPTURE_STAGING_DIR (empty: <EAGLE3WEB_RUNS_DIR>/
# capture_staging), the one place a train stage reads and deletes the files it names.
EAGLE3WEB_CAPTURE_ALLOWED_HOSTS = env_list("EAGLE3WEB_CAPTURE_ALLOWED_HOSTS", [])
EAGLE3WEB_CAPTURE_STAGING_DIR = env_str("EAGLE3WEB_CAPTURE_STAGING_DIR", "")
# The site's address as people reach it (https://eagle3web.example.org), put before the links in alert
# texts, emails and webhooks (a Slack message cannot open a bare /runs/12/); empty: the path alone.
EAGLE3WEB_SITE_URL = env_str("EAGLE3WEB_SITE_URL", "").rstrip("/")
# A web process moves what its first requests loaded out of the garbage collector's sight after this many
# page and API requests and again after ten times as many (eagle3web.gc_freeze; 0: never): a full collection
# then walks only what came since.
EAGLE3WEB_GC_FREEZE_AFTER_REQUESTS = env_int("EAGLE3WEB_GC_FREEZE_AFTER_REQUESTS", 20)
EAGLE3WEB_ALERT_RETRY_SECONDS = env_int("EAGLE3WEB_ALERT_RETRY_SECONDS", 30)
# Alert emails go through Django's mail backends: SMTP by default (set the host), or e.g.
# django.core.mail.backends.console.EmailBackend to print them in the worker's log.
EMAIL_BACKEND = env_str("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("DJANGO_EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL", "eagle3web@localhost")

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
# `make test` runs two pytest-xdist workers at once: each takes the Redis database below the one given (gw0 the given
# one, gw1 the next down), so that their queues and caches stay apart. Here, because pytest-django reads the settings
# before any conftest; only in the worker itself, which hands the database on to the processes its tests start.
_test_worker = os.environ.get("PYTEST_XDIST_WORKER", "") if "pytest" in sys.modules else ""
if _test_worker and re.fullmatch(r"rediss?://[^/]*/\d+", CELERY_BROKER_URL):
    _redis, _database = CELERY_BROKER_URL.rsplit("/", 1)
    CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"] = f"{_redis}/{int(_database) - int(_test_worker[2:])}"
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = DATA_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
        # Where it keeps which queues an exchange routes to; by default "control" in the working
        # directory: a demo started from the clone wrote it into the clone.
        "control_folder": str(_broker_dir / "control"),
    }
    # kombu's file-system transport expects its folders to exist.
    for _folder in ("queue", "processed", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
# Redis hands a message that was taken but never acknowledged back to its queue after this long.
# Messages are acknowledged when their task ends (acks late), so a training holds its own for hours:
# it comes back as a copy that a worker drops (the stage is running, or done). It is only a backstop:
# a worker takes a stage's message by naming itself on the stage's row (workers/orchestration/claims.py), and the
# reconcilers send the message again within a minute of that worker's last heartbeat when it died
# before the stage started; this catches a worker killed in the instant between the two.
EAGLE3WEB_BROKER_VISIBILITY_SECONDS = env_int("EAGLE3WEB_BROKER_VISIBILITY_SECONDS", 120)
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": EAGLE3WEB_BROKER_VISIBILITY_SECONDS}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "cpu"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# The API's failed-authentication counts (runs.api.tokens) live in a cache of their own, beside the
# default one (set above where live pages use it, else Django's): in Redis when there is one
# (EAGLE3WEB_CACHE_URL, else the broker's Redis), so that every web process counts together; in the
# process's memory otherwise (`make demo`'s one runserver).
# An empty value (compose passes one through when unset) means the default too.
EAGLE3WEB_CACHE_URL = env_str("EAGLE3WEB_CACHE_URL", "") or (CELERY_BROKER_URL if CELERY_BROKER_URL.startswith("redis") else "")
CACHES = globals().get("CACHES") or {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# Short socket timeouts: a Redis that stops answering costs a request at most a second before the counts
# fall back to the process's memory (runs.api.tokens), not the operating system's minutes-long connect timeout.
CACHES["auth_failures"] = (
    {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": EAGLE3WEB_CACHE_URL, "KEY_PREFIX": "eagle3web",
     "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}}
    if EAGLE3WEB_CACHE_URL else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "auth-failures"})
# Failed API authentications (bad or revoked tokens) a client address may make in a minute; past it
# every request with a token from that address is refused (429) until the minute ends.
EAGLE3WEB_API_AUTH_FAILURES_PER_MINUTE = env_int("EAGLE3WEB_API_AUTH_FAILURES_PER_MINUTE", 20)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("DJANGO_LOG_LEVEL", "INFO")},
}

# The API's OpenAPI 3 document (runs.api.schema, served at /api/v1/openapi.json and read by /api/v1/).
# No post-processing hooks: a body's choices stay inline, where the API's page reads them.
SPECTACULAR_SETTINGS = {
    "TITLE": "eagle3web API",
    "VERSION": "1",
    "DESCRIPTION": "Launch, watch and control EAGLE-3 draft training runs. Send 'Authorization: Bearer "
                   "<token>'; every error is {\"error\": ..., \"fields\": {...}}.",
    "POSTPROCESSING_HOOKS": [],
}
