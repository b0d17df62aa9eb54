"""The sweep page's val loss is each run's lowest real validation loss on PostgreSQL and on the embedded
SQLite alike: a NaN loss (a diverged validation) is left out, and a run with only NaN shows none. On SQLite
a NaN is stored as NULL, so that `.exclude(val_loss=nan)` there dropped every checkpoint ("–" for every
run). The SQLite side runs in a process of its own on its own file (tests/helpers/sqlite_sweep_site.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.sqlite_sweep_site import EXPECTED, sweep_val_losses, write_inputs
from tests.helpers.worker import BASE_DIR


@pytest.mark.django_db
def test_sweep_val_loss_leaves_out_nan_on_postgresql(user, tmp_path, settings):
    from django.db import connection

    assert connection.vendor == "postgresql"
    settings.EAGLE3WEB_DATA_ROOTS = [tmp_path.resolve()]
    settings.EAGLE3WEB_RUNS_DIR = tmp_path.resolve() / "runs"
    target, chats = write_inputs(tmp_path)
    assert sweep_val_losses(user=user, target=target, chats=chats) == EXPECTED


def test_sweep_val_loss_leaves_out_nan_on_sqlite(tmp_path):
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'site.sqlite3'}",
           "EAGLE3WEB_DATA_ROOTS": str(tmp_path), "EAGLE3WEB_RUNS_DIR": str(tmp_path / "runs"),
           "EAGLE3WEB_VLLM_PREFLIGHT_SECONDS": "0", "DJANGO_SETTINGS_MODULE": "eagle3web.settings"}
    done = subprocess.run([sys.executable, "-m", "tests.helpers.sqlite_sweep_site", str(tmp_path)], env=env,
                          cwd=BASE_DIR, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == EXPECTED
