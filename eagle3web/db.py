"""Writes that ride out a database that is busy or away for a while, instead of failing a stage.

Two ways a write can find the database unable to take it: PostgreSQL restarting or cut off (the
connection drops: OperationalError or InterfaceError), and the embedded SQLite held by another
writer past its busy timeout ("database is locked"). Both pass; the caller's write is tried again,
from a fresh connection, with backoff, for a bounded time, each retry logged. Anything else (a
constraint, a missing table, a bug) is raised at once.

Only a write that owns its transaction can be retried: inside someone else's atomic block the
transaction is already broken, so the error goes to the block's owner."""
from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from django.db import InterfaceError, OperationalError, close_old_connections, connection

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A stage rides out a database away for about this long (a restart, a failover, a network blip)
# before its writes give up and fail it.
DB_OUTAGE_SECONDS = 90.0
FIRST_DELAY, MAX_DELAY = 0.5, 8.0


def db_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not take the statement now (worth trying again), as
    opposed to refusing it (never worth it)."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    if connection.vendor != "sqlite":
        return True  # psycopg raises OperationalError for a lost or refused connection
    # SQLite's OperationalError also means "no such table" or a syntax error: only a lock passes.
    text = str(exc).lower()
    return "locked" in text or "busy" in text or "disk i/o" in text


def db_retry(what: str, write: Callable[..., T], /, *, within: float = DB_OUTAGE_SECONDS, **kwargs) -> T:
    """`write(**kwargs)`, tried again with backoff (0.5 s doubling to 8 s) while the database is
    locked or unreachable, for `within` seconds; then its error is raised. Each retry starts from a
    fresh connection (a dropped one stays broken otherwise) and is logged with what was tried."""
    deadline, delay, tries = time.monotonic() + within, FIRST_DELAY, 0
    while True:
        try:
            return write(**kwargs)
        except (OperationalError, InterfaceError) as exc:
            if connection.in_atomic_block or not db_unavailable(exc) or time.monotonic() + delay > deadline:
                raise
            tries += 1
            logger.warning("%s: the database is not answering (%s); retry %d in %.1f s", what, exc, tries, delay)
            close_old_connections()
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)
