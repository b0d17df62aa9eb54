"""Shared fixtures. Real tiny models, built offline: nothing here may reach a model hub."""
import os

# Must precede any transformers / huggingface_hub import, which read these once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# One torch thread in this process and in every process it starts (Celery workers, torchruns; vLLM binds its
# own): on the suite's 2 shared cores a second OpenMP thread per process made the tiny models ~10x slower
# (evaluate() of 4 prompts, 16 tokens: 15-39 s with one thread, 367 s with two, load 11-15). Before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("EAGLE3WEB_TORCH_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """A trained 8-layer Llama (hidden 128) with its tokenizer and the chats it learned.

    Returns `workers.stages.demo.assets.DemoAssets`: `.target_dir` (config.json,
    model.safetensors, tokenizer.json, tokenizer_config.json with a chat_template that marks
    assistant tokens via {% generation %}) and `.chats_path` (JSONL, ShareGPT- and OpenAI-style
    rows). Built once per session, a few seconds on 2 cores; treat it as read-only.
    """
    # Imported here so tests that never ask for a model do not pay for importing torch.
    from workers.stages.demo.assets import build_demo_assets

    return build_demo_assets(tmp_path_factory.mktemp("tiny-target"), num_conversations=150, train_steps=12, seed=0)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """Every table's ids start at 100,000, as on a server that has run for a while: an id printed with
    a thousands separator (1,091) breaks links, data attributes and the tests that read them."""
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'")
            for (name,) in cursor.fetchall():
                cursor.execute(f'ALTER SEQUENCE "{name}" RESTART WITH 100000')


@pytest.fixture(autouse=True)
def data_root(tmp_path_factory, settings):
    """Every path the tests hand the app lies under pytest's temp root, so the roots allow it."""
    root = tmp_path_factory.getbasetemp().resolve()
    settings.EAGLE3WEB_DATA_ROOTS = [root]
    settings.EAGLE3WEB_RUNS_DIR = root / "runs"
    return root


@pytest.fixture(autouse=True)
def vllm_launch_check_off(settings):
    """vLLM's launch check (runs.pipeline.launch.preflight) costs seconds per new target wherever `make vllm` ran:
    off unless a test turns it on (tests/services/launch/test_launch_preflight.py does)."""
    settings.EAGLE3WEB_VLLM_PREFLIGHT_SECONDS = 0


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_inline():
    """Stages run inline set torch's threads from the setting (workers.orchestration.tasks), which pytest-django read
    before the environment above was set: the setting says one too, for the whole session (module fixtures that run a
    pipeline included)."""
    from django.conf import settings

    before = settings.EAGLE3WEB_TORCH_THREADS
    settings.EAGLE3WEB_TORCH_THREADS = 1
    yield
    settings.EAGLE3WEB_TORCH_THREADS = before


@pytest.fixture(autouse=True)
def capture_hosts_listed(settings):
    """The made-up capture servers the launch tests name live in 10.0.0.0/8, a private network the capture
    host rule refuses unless listed (the setting's own default lists nothing): listed here, as an operator
    would. Tests of the rule set their own list; loopback is never listed here."""
    settings.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS = ["10.0.0.0/8"]


@pytest.fixture(autouse=True)
def live_cache_cleared():
    """Each test starts with nothing cached (runs.live): cache keys carry ids and change counters,
    which another test's database may hand out again."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def default_project_there(request):
    """The open Default project, which the migrations make and every server has, is there for each test that uses
    the database: a transactional test empties every table when it ends, and the tests after it on the same
    pytest worker would otherwise find none (a launch would then make it, a list would lack it)."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None and not {"db", "transactional_db"} & set(request.fixturenames):
        return
    request.getfixturevalue("db")  # the test's own database access, transactional or not (pytest-django's helper)
    from runs.projects.models import default_project_pk

    default_project_pk()


@pytest.fixture
def user(django_user_model):
    """A logged-in-able user; `raw_password` is what a person would type."""
    from django.contrib.auth.models import Group

    account = django_user_model.objects.create_user("launcher", password="pw-launcher-1")
    account.groups.add(Group.objects.get_or_create(name="launcher")[0])
    account.raw_password = "pw-launcher-1"
    return account


@pytest.fixture
def worker(data_root, transactional_db, tmp_path):
    """A real Celery worker process on the tests' PostgreSQL database and Redis broker."""
    from tests.helpers.worker import celery_worker

    log_path = tmp_path / "worker.log"
    with celery_worker(data_root=data_root, log_path=log_path) as proc:
        proc.log_path = log_path
        yield proc


@pytest.fixture
def config_only_target(tmp_path):
    """A target directory holding only config.json (8 layers, hidden 16): enough to verify against."""
    import json

    path = tmp_path / "config-only-target"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "num_hidden_layers": 8, "hidden_size": 16, "vocab_size": 1000}))
    return path


@pytest.fixture
def roots(tmp_path, settings):
    """The data root of a launch that never runs a model: `target/` (config.json only: 8 layers,
    hidden 64, vocabulary 5,000) and `chats.jsonl` (one chat), with runs written under `runs/`."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    settings.EAGLE3WEB_DATA_ROOTS = [data.resolve()]
    settings.EAGLE3WEB_RUNS_DIR = data.resolve() / "runs"
    (data / "target").mkdir()
    (data / "target" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
        "hidden_size": 64, "vocab_size": 5000}))
    (data / "chats.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    return data
