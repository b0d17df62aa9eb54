"""Two helpers of database access: writes that ride out a database busy or away for a while (db_retry), and
statements compiled once a process (compile_query).

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
from dataclasses import dataclass, replace
from typing import Callable, TypeVar

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection, connections
from django.db.models import QuerySet
from django.db.models.query import ValuesIterable

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


# Statements the ORM builds once a process, for the reads and writes every request or batch makes: building and
# compiling their querysets cost several times what PostgreSQL took to answer them (issue 40).
#
# The queryset is built once with stand-in values (ids no row has) where each call's values go. Its compiled
# parameters then say, place by place, which stand-in goes there or which constant the query fixed, so the rule
# that built it (a project's visibility, a filter) stays written once, in the ORM, where it was.
#
#     query = compile_query(User.objects.filter(pk=stand_in(0)).values_list("username"), user=stand_in(0))
#     query.fetch_one(user=7)

# Negative (no row has such an id) and inside a 32-bit integer column's range: Django makes a lookup of a value
# outside a field's range match nothing, compiling to no statement at all.
_STAND_INS_FROM, _STAND_INS = -1_000_000_000, 1_000_000_000


def stand_in(n: int) -> int:
    """The n-th stand-in id (n under a billion: an `__in` of that many ids): no row's id, nor a constant a query
    is likely to hold."""
    if not 0 <= n < _STAND_INS:
        raise ValueError(f"stand-in {n} is out of range")
    return _STAND_INS_FROM - n


class _PreparingCursor(psycopg.Cursor):
    """psycopg's cursor binding on the server, each statement prepared on the connection at its first run (psycopg
    keeps the last 100 a connection): PostgreSQL plans it once, not every request (the runs list's rows took 0.7 ms to
    plan and 2 to run, issue 40)."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)

    def _send_query_prepared(self, name, pgq, *, binary=None):
        # The statement run, kept as a run unprepared keeps it: Django's log of queries (its last_executed_query)
        # reads it, and read nothing of a prepared one (psycopg 3.2).
        self._query = pgq
        super()._send_query_prepared(name, pgq, binary=binary)


_ONLY_ASKED = 2**62


def server_cursor(connection=connection, *, prepare: bool = False):
    """A cursor of PostgreSQL's `connection` binding its parameters on the server (psycopg's own; Django's binds them
    in the client): bytes travel as they are. With `prepare` (and DATABASE_PREPARED_STATEMENTS on) each statement is
    prepared on the connection at its first run. Logged as Django's are."""
    connection.ensure_connection()
    cursor_class = psycopg.Cursor
    if prepare and settings.DATABASE_PREPARED_STATEMENTS:
        if connection.connection.prepare_threshold is None:
            # Django's default turns preparing off on the connection, asked for or not; this turns on only the asked
            # (no other statement runs that many times).
            connection.connection.prepare_threshold = _ONLY_ASKED
        cursor_class = _PreparingCursor
    raw = cursor_class(connection.connection)
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


def prepared_cursor(connection):
    """A cursor for a statement compiled once: on PostgreSQL (unless DATABASE_PREPARED_STATEMENTS is off) one that
    prepares it; Django's otherwise."""
    if connection.vendor != "postgresql" or not settings.DATABASE_PREPARED_STATEMENTS:
        return connection.cursor()
    return server_cursor(connection, prepare=True)


@dataclass(frozen=True)
class CompiledQuery:
    database: str
    sql: str
    slots: tuple  # per parameter: the name of the value that goes there, or ("constant", the query's own value)
    # A values() queryset's: its names in its select's order, and per column (its place, Django's converters, the
    # expression) what values() would apply to a value read (a JSON field's parse, a subquery's float).
    columns: tuple[str, ...] = ()
    converters: tuple = ()

    def params(self, **values) -> list:
        return [values[slot] if isinstance(slot, str) else slot[1] for slot in self.slots]

    def fetch_one(self, **values) -> tuple | None:
        with prepared_cursor(connections[self.database]) as cursor:
            cursor.execute(self.sql, self.params(**values))
            return cursor.fetchone()

    def fetch_values(self, **values) -> list[dict]:
        """The rows as the values() queryset it was compiled from gives them: dicts by its names, converted."""
        if not self.columns:
            raise TypeError("fetch_values needs a query compiled from a values() queryset")
        connection = connections[self.database]
        with prepared_cursor(connection) as cursor:
            cursor.execute(self.sql, self.params(**values))
            rows = cursor.fetchall()
        out = []
        for row in rows:
            row = list(row[:len(self.columns)])
            for place, functions, expression in self.converters:
                value = row[place]
                for function in functions:
                    value = function(value, expression, connection)
                row[place] = value
            out.append(dict(zip(self.columns, row)))
        return out


def compile_query(rows: QuerySet, **stand_ins: int) -> CompiledQuery:
    """`rows` compiled, each of `stand_ins` (name=its stand-in value) named where it goes. Each must appear
    exactly once among the parameters: a rule that dropped one, or repeated it, would otherwise be run with
    the wrong values, so it fails here, at the first call, instead. A values() queryset's names and converters
    come with it, for fetch_values. (The converters are Django's for the compiling thread's connection: a
    backend's hold nothing of the connection but its settings, alike in every thread.)"""
    compiler = rows.query.get_compiler(rows.db)
    sql, params = compiler.as_sql()
    compiled = compile_statement(sql, params, database=rows.db, **stand_ins)
    if rows._iterable_class is not ValuesIterable:
        return compiled
    query = rows.query
    # As ValuesIterable names them.
    columns = tuple(query.selected) if query.selected else (*query.extra_select, *query.values_select,
                                                            *query.annotation_select)
    selected = [expression for expression, _, _ in compiler.select[:compiler.col_count]]
    converters = tuple((place, tuple(functions), expression)
                       for place, (functions, expression) in compiler.get_converters(selected).items())
    return replace(compiled, columns=columns, converters=converters)


def compile_statement(sql: str, params: tuple, *, database: str, **stand_ins: int) -> CompiledQuery:
    """compile_query for a statement put together from several querysets' compiled text and parameters (each
    its own stand-ins, so that each still appears once)."""
    named = {value: name for name, value in stand_ins.items()}
    slots = tuple(named[p] if type(p) is int and p in named else ("constant", p) for p in params)
    for name in stand_ins:
        if slots.count(name) != 1:
            raise AssertionError(f"{name} is in the compiled statement {slots.count(name)} times, not once: {sql}")
    return CompiledQuery(database=database, sql=sql, slots=slots)
