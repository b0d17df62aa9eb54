"""eagle3web.db.db_retry against a real lock: another connection holds a row of the tests'
PostgreSQL while a write with a short lock_timeout (PostgreSQL's "database is locked") tries it."""
import logging
import threading
import time

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import ProgrammingError, connection, transaction

from eagle3web.db import db_retry
from tests.helpers.worker import test_database_url as database_url  # renamed: pytest would collect it

pytestmark = pytest.mark.django_db(transaction=True)


def hold_row(pk: int, *, seconds: float, held: threading.Event) -> threading.Thread:
    """A connection of its own locks user `pk` for `seconds`, then lets go."""
    def hold():
        with psycopg.connect(database_url()) as other:
            other.execute("SELECT id FROM auth_user WHERE id = %s FOR UPDATE", (pk,))
            held.set()
            time.sleep(seconds)
            other.rollback()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(10)
    return thread


@transaction.atomic
def rename(*, pk: int, name: str) -> int:
    """A service's write, in its own transaction, that waits at most 0.1 s for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '100ms'")
    return User.objects.filter(pk=pk).update(first_name=name)


def test_a_write_rides_out_a_held_lock_with_backoff_and_logs_each_retry(caplog):
    user = User.objects.create_user("locked")
    held = threading.Event()
    holder = hold_row(user.pk, seconds=2.5, held=held)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="eagle3web.db"):
        assert db_retry("rename", rename, pk=user.pk, name="after") == 1
    waited = time.monotonic() - started
    holder.join()
    assert User.objects.get(pk=user.pk).first_name == "after"
    retries = [r.getMessage() for r in caplog.records]
    # Tries at about 0, 0.6 and 1.7 s meet the lock (held 2.5 s); the fourth, after 2 s more, gets the row.
    assert len(retries) == 3, retries
    assert all(m.startswith("rename: the database is not answering (canceling statement due to lock timeout")
               for m in retries)
    assert [m.rsplit("retry ", 1)[1] for m in retries] == ["1 in 0.5 s", "2 in 1.0 s", "3 in 2.0 s"]
    assert 3.5 <= waited < 10


def test_past_its_bound_the_error_is_raised(caplog):
    user = User.objects.create_user("held-long")
    held = threading.Event()
    holder = hold_row(user.pk, seconds=4.0, held=held)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="eagle3web.db"), pytest.raises(Exception, match="lock timeout"):
        db_retry("rename", rename, within=1.0, pk=user.pk, name="never")
    assert time.monotonic() - started < 2.5  # 0.5 s of backoff, then the next (1 s) would pass the bound
    assert len(caplog.records) == 1
    holder.join()
    assert User.objects.get(pk=user.pk).first_name == ""


def test_inside_a_transaction_the_error_goes_to_its_owner(caplog):
    user = User.objects.create_user("in-atomic")
    held = threading.Event()
    holder = hold_row(user.pk, seconds=2.0, held=held)
    started = time.monotonic()
    with pytest.raises(Exception, match="lock timeout"), transaction.atomic():
        db_retry("rename", rename, pk=user.pk, name="never")
    assert time.monotonic() - started < 1.5 and not caplog.records  # no retry: the transaction is broken
    holder.join()


def test_a_refused_statement_is_not_tried_again(caplog):
    def broken():
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    with pytest.raises(ProgrammingError):
        db_retry("broken", broken)
    assert not caplog.records
