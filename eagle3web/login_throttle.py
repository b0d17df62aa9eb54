"""Sign-in throttling for the login page and the admin's, with django-axes: failed attempts are rows in
the database (axes' AccessAttempt), so the throttle holds across web processes and keeps working while
Redis is away. Two bounds, both over the last AXES_COOLOFF_TIME: EAGLE3WEB_LOGIN_FAILURES_PER_NAME
failures for one user name from one address, EAGLE3WEB_LOGIN_FAILURES_PER_ADDRESS from one address
whatever the names (a guesser spraying names). Past either, every sign-in from there is refused, the
right password included, with the same answer whether the name exists or not.

`manage.py axes_reset` (or axes_reset_ip / axes_reset_username) lifts a lockout sooner."""
from __future__ import annotations

from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Sum
from django.http import HttpResponse


def client_address(request) -> str | None:
    # REMOTE_ADDR, as the API's rate limit: a header the client sets itself would let it pick its own bucket.
    # None where there is none (the test client's login), as axes' own default: the column holds addresses.
    return request.META.get("REMOTE_ADDR") or None


def lockout_message() -> str:
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    return (f"Too many failed sign-ins from this address or with this user name: sign-in is locked for {minutes} "
            "minutes after the last failed attempt. Wait, or ask an admin to lift it (manage.py axes_reset_ip).")


class LoginThrottleBackend(AxesStandaloneBackend):
    """axes' check before the password is: a locked-out sign-in is refused here. Code that authenticates
    without a request (Django's test client, a shell) is no sign-in from an address, so passes through to
    the password check instead of axes' error."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class LoginThrottleHandler(AxesDatabaseHandler):
    """axes compares one failure count with one limit; ours has two, per (address, name) and per address
    (AXES_LOCKOUT_PARAMETERS in that order). The address's count is scaled onto the name's limit, so that
    it reaches that limit exactly when it reaches its own."""

    def get_failures(self, request, credentials=None) -> int:
        per_name, per_address = (
            attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
            for attempts in self.get_user_attempts(request, credentials))
        name_limit = settings.AXES_FAILURE_LIMIT
        return max(per_name, per_address * name_limit // settings.EAGLE3WEB_LOGIN_FAILURES_PER_ADDRESS)

    def reset_user_attempts(self, request, credentials=None) -> int:
        # A right password (AXES_RESET_ON_SUCCESS) clears that name's failures from that address only: axes
        # would clear the address's too, letting a guesser who holds one account reset the per-address bound.
        count, _ = self.filter_user_attempts(request, credentials)[0].delete()
        return count


class _SaysLockout:
    """The form's error says why when axes refused the sign-in (the request is marked during authenticate);
    `locked_out` holds it for the login page, which words a wrong password its own way."""

    locked_out = ""

    def get_invalid_login_error(self):
        if getattr(self.request, "axes_locked_out", False):
            self.locked_out = lockout_message()
            return forms.ValidationError(self.locked_out, code="locked_out")
        return super().get_invalid_login_error()


class ThrottledAuthenticationForm(_SaysLockout, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(_SaysLockout, AdminAuthenticationForm):
    pass


def lockout_response(request, original_response=None, credentials=None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the login page as its view drew it, its form saying why, answered 429."""
    if original_response is not None and original_response.status_code == 200:
        original_response.status_code = 429
        return original_response
    return HttpResponse(lockout_message(), status=429, content_type="text/plain; charset=utf-8")
