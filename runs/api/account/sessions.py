"""The browser's sign-in sessions (settings.SESSION_ENGINE) and the signed-in user (UserBackend, in
settings.AUTHENTICATION_BACKENDS): Django's database sessions and ModelBackend, whose two reads, which every
signed-in request makes, are statements compiled once instead of ORM queries built and compiled each time
(issue 40: building each cost several times what PostgreSQL took to answer it).

Everything else is Django's `db` engine: the row is the session, so signing out (which deletes it) ends it at
once in every web process, and so does an expiry; there is no copy anywhere to go stale. Not `cached_db`: a
copy in each process's memory (CACHES' default) would keep a signed-out session alive in the other gunicorn
workers, and one in Redis costs a round trip as long as this indexed read, with a second store to keep in step
on sign-out. Not signed cookies: a copied cookie would stay valid after its owner signs out. The user is read
on every request too (a user made inactive, or whose password changed, is signed out on the next one)."""
from __future__ import annotations

from functools import lru_cache

from django.contrib.auth import BACKEND_SESSION_KEY, get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.sessions.backends import db
from django.core.exceptions import ValidationError
from django.db import connections, router
from django.utils import timezone

from eagle3web.db import CompiledQuery, compile_query, prepared_cursor, stand_in


USER_BACKEND = "runs.api.account.sessions.UserBackend"
# What sessions made before UserBackend name (Django's, which it is with one read changed): read as UserBackend's,
# so that they stay signed in.
DJANGOS_BACKEND = "django.contrib.auth.backends.ModelBackend"


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
            with prepared_cursor(connections[router.db_for_read(self.model)]) as cursor:
                cursor.execute(_read_sql(self.model), [key, timezone.now()])
                row = cursor.fetchone()
        if row is None:
            self._session_key = None
            return None
        return self.model(session_key=key, session_data=row[0], expire_date=row[1])

    def load(self):
        data = super().load()
        if data.get(BACKEND_SESSION_KEY) == DJANGOS_BACKEND:
            data[BACKEND_SESSION_KEY] = USER_BACKEND
        return data


@lru_cache(maxsize=4)
def _user_statement(model) -> tuple[CompiledQuery, list[str]]:
    """The ORM's own statement for the user of an id (its default manager's), compiled once."""
    names = [field.attname for field in model._meta.concrete_fields]
    return compile_query(model._default_manager.filter(pk=stand_in(0)).values_list(*names), user=stand_in(0)), names


class UserBackend(ModelBackend):
    """Django's ModelBackend (passwords, permissions), the user's read compiled once."""

    def get_user(self, user_id):
        model = get_user_model()
        try:
            user_id = model._meta.pk.to_python(user_id)
        except ValidationError:
            return None
        statement, names = _user_statement(model)
        row = statement.fetch_one(user=user_id)
        if row is None:
            return None
        user = model.from_db(statement.database, names, row)
        return user if self.user_can_authenticate(user) else None
