"""One migration builds the schema: a database made fresh by runs/migrations/0001_initial.py and one
migrated through the old chain (0001-0020, kept in tests/old_migrations/runs/ for this test alone)
end up with the same tables, columns, constraints, indexes and roles. Migrations written since the
squash are migrated forwards and then back to 0001 on the fresh one."""
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
MIGRATE = """
import sys, django
django.setup()
from django.conf import settings
if sys.argv[1] == "old":
    settings.MIGRATION_MODULES = {"runs": "tests.old_migrations.runs"}
from django.core.management import call_command
call_command("migrate", verbosity=0)
if sys.argv[1] == "new":
    # The squash is 0001 alone; later migrations (0002...) are unapplied again, which also proves each reverses.
    call_command("migrate", "runs", "0001_initial", verbosity=0)
"""
COLUMNS = """
SELECT table_name, column_name, data_type, is_nullable, character_maximum_length, numeric_precision,
       is_identity, column_default
FROM information_schema.columns WHERE table_schema = 'public'"""
CONSTRAINTS = """
SELECT conrelid::regclass::text, contype, pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace"""
INDEXES = """
SELECT tablename, regexp_replace(indexdef, 'INDEX \\S+ ON', 'INDEX ON')
FROM pg_indexes WHERE schemaname = 'public'"""


def _url(name: str) -> str:
    params = connection.settings_dict
    user = params["USER"] or "postgres"
    auth = f"{user}:{params['PASSWORD']}" if params["PASSWORD"] else user
    return f"postgres://{auth}@{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}/{name}"


def _schema(url: str) -> dict:
    with psycopg.connect(url) as conn:
        return {
            "columns": sorted(map(tuple, conn.execute(COLUMNS).fetchall())),
            # Names differ only by history (an index kept its name through a rename): compare definitions.
            "constraints": sorted(map(tuple, conn.execute(CONSTRAINTS).fetchall())),
            "indexes": sorted(map(tuple, conn.execute(INDEXES).fetchall())),
            "roles": sorted(r[0] for r in conn.execute("SELECT name FROM auth_group").fetchall()),
            "migrated": conn.execute("SELECT count(*) FROM django_migrations WHERE app = 'runs'").fetchone()[0],
        }


@pytest.fixture
def scratch_databases():
    base = connection.settings_dict["NAME"]
    names = [f"{base}_fresh", f"{base}_old_chain"]
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            admin.execute(f'CREATE DATABASE "{name}"')
    yield names
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _migrate(url: str, chain: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "eagle3web.settings"}
    subprocess.run([sys.executable, "-c", MIGRATE, chain], cwd=ROOT, env=env, check=True, timeout=300)


def test_the_initial_migration_builds_the_schema_the_old_chain_built(scratch_databases):
    fresh, old = (_url(name) for name in scratch_databases)
    _migrate(fresh, "new")
    _migrate(old, "old")
    made_fresh, made_by_chain = _schema(fresh), _schema(old)
    assert made_fresh["migrated"] == 1
    assert made_by_chain["migrated"] == 20
    assert made_fresh["roles"] == made_by_chain["roles"] == ["admin", "launcher", "reviewer", "viewer"]
    for part in ("columns", "constraints", "indexes"):
        assert set(made_fresh[part]) ^ set(made_by_chain[part]) == set(), part
