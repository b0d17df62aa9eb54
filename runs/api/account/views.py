"""/account/: a user's API tokens (made here, shown once, revoked here, with when each was last used),
whether their teams may act on their runs, and what their tokens did lately."""
from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from runs.api import tokens
from runs.roles import ROLES


def _page(request: HttpRequest, *, secret: str = "", made=None, error: str = "", status: int = 200) -> HttpResponse:
    response = render(request, "api/account.html", {
        "tokens": tokens.user_tokens(user=request.user), "secret": secret, "made": made, "error": error,
        "settings": tokens.account_settings(user=request.user),
        "teams": sorted(g.name for g in request.user.groups.all() if g.name not in ROLES),
        "audit": tokens.user_audit(user=request.user, limit=20),
    }, status=status)
    if secret:
        response["Cache-Control"] = "no-store"  # the one page that shows the secret: no copy kept by a cache
    return response


def account(request: HttpRequest) -> HttpResponse:
    """GET: the page. POST: make a token named `name` and show its secret, this once."""
    if request.method != "POST":
        return _page(request)
    try:
        token, secret = tokens.token_create(user=request.user, name=request.POST.get("name", ""))
    except tokens.TokenError as exc:
        return _page(request, error=str(exc), status=400)
    return _page(request, secret=secret, made=token)


@require_POST
def account_token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        token = tokens.token_revoke(user=request.user, token_id=pk)
    except tokens.TokenError as exc:  # another user's token is none of this user's business
        raise Http404(str(exc)) from None
    messages.success(request, f"Revoked {token.name} ({token.prefix}…): requests with it are refused from now on.")
    return redirect("account")


@require_POST
def account_team(request: HttpRequest) -> HttpResponse:
    row = tokens.account_team_set(user=request.user, team_may_act=request.POST.get("team_may_act") == "on")
    messages.success(request, "Your teams may now cancel, retry and tag your runs." if row.team_may_act
                     else "Only you and admins may cancel, retry and tag your runs.")
    return redirect("account")
