"""The browser's sign-in sessions (settings.SESSION_ENGINE): Django's database sessions, whose read, which every
signed-in request makes, is one statement written once instead of an ORM query built and compiled each time
(issue 40: building it cost about three times what PostgreSQL took to answer it).

Everything else is Django's `db` engine: the row is the session, so signing out (which deletes it) ends it at
once in every web process, and so does an expiry; there is no copy anywhere to go stale. Not `cached_db`: a
copy in each process's memory (CACHES' default) would keep a signed-out session alive in the other gunicorn
workers, and one in Redis costs a round trip as long as this indexed read, with a second store to keep in step
on sign-out. Not signed cookies: a copied cookie would stay valid after its owner signs out."""
from __future__ import annotations

from functools import lru_cache

from django.contrib.sessions.backends import db
from django.db import connections, router
from django.utils import timezone


@lru_cache(maxsize=4)
def _read_sql(model) -> str:
    table, quote = model._meta.db_table, connections[router.db_for_read(model)].ops.quote_name
    return (f"SELECT {quote('session_data')}, {quote('expire_date')} FROM {quote(table)} "
            f"WHERE {quote('session_key')} = %s AND {quote('expire_date')} > %s")


class SessionStore(db.SessionStore):
    def _get_session_from_db(self):
        """As Django's: the unexpired row of this key, else None (and the key forgotten, so a new one is made)."""
        key, row = self.session_key, None  # None when the cookie's was not a key's shape (SessionBase checks)
        if key:
            with connections[router.db_for_read(self.model)].cursor() as cursor:
                cursor.execute(_read_sql(self.model), [key, timezone.now()])
                row = cursor.fetchone()
        if row is None:
            self._session_key = None
            return None
        return self.model(session_key=key, session_data=row[0], expire_date=row[1])
