# eagle3web: `make demo` for a dashboard on this machine, `make test` for the test suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
VLLM_VENV := .venv-vllm
PORT ?= 8000
DEMO_DIR ?= data/demo
# The tests talk to real servers: PostgreSQL and Redis (.ci/run starts them when they are down).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15

.PHONY: setup migrate demo worker web test docs bench check-outputs browser-deps compose-deps vllm mlflow

setup: $(VENV)/.installed migrate

# Development installs requirements-dev.txt: the runtime's requirements.txt (all the images install)
# plus the tests' and the docs' tools.
$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt client/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -r requirements-dev.txt
	@# The API's client (client/: package eagle3web_client, command eagle3web), editable: its tests use it.
	$(PY) -m pip install -q -c constraints.txt -e ./client
	@# speculators pulls these; they do not load beside the CPU torch build and break transformers' import.
	$(PY) -m pip uninstall -y -q torchvision torchaudio || true
	touch $@

# vLLM in its own environment (.venv-vllm): the CPU build here, the CUDA build on a host with NVIDIA's
# driver; workers find it there (workers/contract/host/vllm_env.py). deploy/install_vllm.sh says why apart.
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: deploy/install_vllm.sh constraints.txt
	PYTHON=$(PYTHON) deploy/install_vllm.sh $(VLLM_VENV)
	touch $@

migrate: $(VENV)/.installed
	$(PY) manage.py migrate --noinput -v 0

demo: setup
	@# The build says how far it is on stderr; the login is printed once the server answers and again,
	@# last, once both workers are ready (their banners would bury it otherwise).
	@# Two workers: gpu@ trains (gpu, and vLLM's queues where vLLM is installed); cpu@ takes the cpu
	@# queue alone (verifications, catalogues, prepare, vocab), so a short job never waits behind a
	@# training. EAGLE3WEB_WORKER_GPU_QUEUES=0 keeps cpu@ off the GPU queues on a host with GPUs.
	@# The demo target is built by the cpu worker (a job the launch page shows with its progress), not
	@# before the server starts: the login comes first. A finished build is reused, not queued again.
	$(PY) manage.py build_demo_assets $(DEMO_DIR) --as-job
	since=$$(date +%s); trap 'kill 0' EXIT; \
	EAGLE3WEB_WORKER_GPU_QUEUES=0 $(PY) -m celery -A eagle3web worker -Q cpu -n cpu@%h --concurrency 2 --loglevel INFO & \
	$(PY) -m celery -A eagle3web worker -Q gpu -n gpu@%h --concurrency 1 --loglevel INFO & \
	$(PY) manage.py runserver 127.0.0.1:$(PORT) --noreload & \
	$(PY) manage.py demo_login --wait-for http://127.0.0.1:$(PORT)/ --workers cpu,gpu --since $$since && wait

worker: setup
	$(PY) -m celery -A eagle3web worker -Q cpu,gpu --concurrency 1 --loglevel INFO

web: setup
	$(PY) manage.py runserver 127.0.0.1:$(PORT)

# TEST_WORKERS pytest-xdist workers (one a core here), a file's tests on one worker (tests/helpers/worker.py started_here);
# TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The docs site (docs/, mkdocs.yml) into site/; --strict: a broken link or a page left out of the nav fails.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(VENV)/.installed
	$(PY) bench/pipeline/pipeline.py --json

# Compose for tests/settings/test_compose.py, which loads docker-compose.yml with it: the Docker CLI's
# plugin where there is one, else Debian's docker-compose (1.29.2 on bookworm; it needs no Docker engine).
compose-deps:
	docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || \
	  (apt-get update -q && apt-get install -y -q --no-install-recommends docker-compose)

# Debian's Chromium for the browser tests (Playwright cannot download its own browser here).
browser-deps:
	test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium)

# MLflow's tracking server in its own environment (.venv-mlflow), for bench/tracker/api.py's comparison only:
# nothing of eagle3web imports it.
MLFLOW_VENV := .venv-mlflow
MLFLOW_VERSION ?= 3.17.2

mlflow: $(MLFLOW_VENV)/.installed

$(MLFLOW_VENV)/.installed:
	test -x $(MLFLOW_VENV)/bin/python || $(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/python -m pip install -q --upgrade pip
	$(MLFLOW_VENV)/bin/python -m pip install -q mlflow==$(MLFLOW_VERSION) psycopg2-binary  # its store on PostgreSQL, as ours
	touch $@
