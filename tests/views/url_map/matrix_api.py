"""The authorization matrix's entries for the account page, the alerts and reports pages and the REST API
(/api/v1/); the API is asked with each role's token and JSON bodies (Entry.api), as a script would."""
from __future__ import annotations

from tests.views.url_map.matrix_vocabulary import (FORBIDDEN, LOGIN, NOT_FOUND, OK, OWNERS, POST_ONLY, READ, REDIRECT,
                                                   UNAUTHORIZED, Entry, by_role)

API_READ = by_role(UNAUTHORIZED, OK, OK, OK, OK)
API_POST_ONLY = by_role(UNAUTHORIZED, "405", "405", "405", "405")
API_OWNERS = by_role(UNAUTHORIZED, FORBIDDEN, FORBIDDEN, FORBIDDEN, OK)  # the world's runs are the admin's
API_LAUNCHERS = by_role(UNAUTHORIZED, FORBIDDEN, "201", FORBIDDEN, "201")

API = {
    # The account page: tokens and who may act on one's runs. A token is made on the page (200, shown
    # once); another user's token is not found (404).
    "account/": Entry("/account/", get=READ, post=by_role(LOGIN, OK, OK, OK, OK), data="token_form"),
    "account/tokens/<int:pk>/revoke/": Entry("/account/tokens/{spare_token}/revoke/", get=POST_ONLY,
                                             post=by_role(LOGIN, NOT_FOUND, NOT_FOUND, NOT_FOUND, REDIRECT)),
    "account/team/": Entry("/account/team/", get=POST_ONLY, post=by_role(LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT)),
    # Alerts: anyone signed in keeps their own rules and bell; the world's rule is the admin's, so another
    # user's delete finds no rule of theirs (a message, nothing deleted).
    "alerts/": Entry("/alerts/", get=READ),
    "alerts/read/": Entry("/alerts/read/", get=POST_ONLY, post=by_role(LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT)),
    "alerts/rules/": Entry("/alerts/rules/", get=READ, post=by_role(LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT),
                           data="alert_rule_form"),
    "alerts/rules/<int:pk>/delete/": Entry("/alerts/rules/{alert_rule}/delete/", get=POST_ONLY,
                                           post=by_role(LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT)),
    # Reports: anyone signed in reads and writes one; the world's report is the admin's, edited by its author.
    "reports/": Entry("/reports/", get=READ),
    "reports/new/": Entry("/reports/new/", get=READ, post=by_role(LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT),
                          data="report_form"),
    "reports/<int:pk>/": Entry("/reports/{report}/", get=READ),
    "reports/<int:pk>/edit/": Entry("/reports/{report}/edit/", get=by_role(LOGIN, FORBIDDEN, FORBIDDEN, FORBIDDEN, OK),
                                    post=OWNERS, data="report_form"),
    "reports/<int:pk>/versions/": Entry("/reports/{report}/versions/", get=READ),
    "reports/<int:pk>/versions/<int:number>/": Entry("/reports/{report}/versions/1/", get=READ),
    "reports/<int:pk>/export/": Entry("/reports/{report}/export/", get=READ),
    # The REST API, with tokens. Its page is a page (the session's); the rest answers JSON.
    "api/v1/": Entry("/api/v1/", get=READ),
    "api/v1/openapi.json": Entry("/api/v1/openapi.json", get=API_READ, api=True),
    "api/v1/runs/": Entry("/api/v1/runs/", get=API_READ, post=API_LAUNCHERS, data="launch_body", api=True),
    # Projects: those who may launch create one (each its own name); a saved view is anyone's own.
    "api/v1/projects/": Entry("/api/v1/projects/", get=API_READ, post=API_LAUNCHERS, data="project_body", api=True),
    # A project's members: listed to whoever sees it (the world's is the open Default project), changed by its
    # owners and staff (the admin, a superuser, owns every project); the detail URL only deletes (tests/views'
    # test_project_members.py), so GET and POST are refused.
    "api/v1/projects/<int:pk>/members/": Entry("/api/v1/projects/{project}/members/", get=API_READ, post=API_OWNERS,
                                               data="member_body", api=True),
    "api/v1/projects/<int:pk>/members/<str:username>/": Entry("/api/v1/projects/{project}/members/matrix-viewer/",
                                                             get=API_POST_ONLY, post=API_POST_ONLY, api=True),
    "projects/<int:pk>/": Entry("/projects/{project}/", get=READ, post=OWNERS, data="member_form"),
    "api/v1/saved-views/": Entry("/api/v1/saved-views/", get=API_READ, post=by_role(UNAUTHORIZED, "201", "201", "201", "201"),
                                 data="saved_view_body", api=True),
    "api/v1/runs/<int:pk>/": Entry("/api/v1/runs/{run}/", get=API_READ, api=True),
    # What the run page polls (with the session), as a script may (with a token).
    "api/v1/runs/<int:pk>/status/": Entry("/api/v1/runs/{run}/status/", get=API_READ, api=True),
    "api/v1/runs/<int:pk>/cancel/": Entry("/api/v1/runs/{run}/cancel/", get=API_POST_ONLY, post=API_OWNERS, api=True),
    "api/v1/runs/<int:pk>/retry/": Entry("/api/v1/runs/{run}/retry/", get=API_POST_ONLY, post=API_OWNERS, api=True),
    "api/v1/runs/<int:pk>/tags/": Entry("/api/v1/runs/{run}/tags/", get=API_POST_ONLY, post=API_OWNERS,
                                        data="tags_body", api=True),
    # "Keep the cache" of an online run: the world's run is the admin's, and offline (400: nothing to keep).
    "api/v1/runs/<int:pk>/keep-cache/": Entry("/api/v1/runs/{run}/keep-cache/", get=API_POST_ONLY, api=True,
                                              post=by_role(UNAUTHORIZED, FORBIDDEN, FORBIDDEN, FORBIDDEN, "400")),
    # A copy is the copier's own run.
    "api/v1/runs/<int:pk>/copy/": Entry("/api/v1/runs/{run}/copy/", get=API_POST_ONLY, post=API_LAUNCHERS, api=True),
    "api/v1/runs/<int:pk>/stages/": Entry("/api/v1/runs/{run}/stages/", get=API_READ, api=True),
    "api/v1/runs/<int:pk>/attempts/": Entry("/api/v1/runs/{run}/attempts/", get=API_READ, api=True),
    # A run trained elsewhere (the admin's) takes points, checkpoints and its end from its owner and admins; the
    # admin's checkpoint names no directory (400: past the roles, refused for its path).
    "api/v1/runs/<int:pk>/metrics/": Entry("/api/v1/runs/{external_run}/metrics/?points=100", get=API_READ, api=True,
                                           post=API_OWNERS, data="points_body"),
    "api/v1/runs/<int:pk>/checkpoints/": Entry("/api/v1/runs/{external_run}/checkpoints/", get=API_POST_ONLY, api=True,
                                               post=by_role(UNAUTHORIZED, FORBIDDEN, FORBIDDEN, FORBIDDEN, "400"),
                                               data="checkpoint_body"),
    "api/v1/runs/<int:pk>/end/": Entry("/api/v1/runs/{external_run}/end/", get=API_POST_ONLY, api=True, post=API_OWNERS,
                                       data="end_body"),
    "api/v1/runs/<int:pk>/metrics/export/": Entry("/api/v1/runs/{run}/metrics/export/?key=loss&split=train",
                                                  get=API_READ, api=True),
    "api/v1/checkpoints/<int:pk>/": Entry("/api/v1/checkpoints/{checkpoint}/", get=API_READ, api=True),
    "api/v1/checkpoints/<int:pk>/generations/": Entry("/api/v1/checkpoints/{checkpoint}/generations/", get=API_READ,
                                                      api=True),
    # The launcher's request is queued (202); the admin's, with the same settings, finds it queued (200).
    "api/v1/checkpoints/<int:pk>/evaluate/": Entry(
        "/api/v1/checkpoints/{checkpoint}/evaluate/", get=API_POST_ONLY, data="evaluate_form", api=True,
        post=by_role(UNAUTHORIZED, FORBIDDEN, "202", FORBIDDEN, OK)),
    # The matrix's checkpoint names no folder on disk: past the roles, the export is refused for it (400).
    "api/v1/checkpoints/<int:pk>/export/": Entry("/api/v1/checkpoints/{checkpoint}/export/", get=API_POST_ONLY, api=True,
                                                 post=by_role(UNAUTHORIZED, FORBIDDEN, "400", FORBIDDEN, "400")),
    "api/v1/extractions/": Entry("/api/v1/extractions/", get=API_READ, post=API_LAUNCHERS, data="import_body", api=True),
    "api/v1/extractions/<int:pk>/": Entry("/api/v1/extractions/{extraction}/", get=API_READ, api=True),
    "api/v1/extractions/<int:pk>/verify/": Entry("/api/v1/extractions/{extraction}/verify/", get=API_POST_ONLY,
                                                 post=by_role(UNAUTHORIZED, FORBIDDEN, "202", "202", "202"), api=True),
    "api/v1/datasets/": Entry("/api/v1/datasets/", get=API_READ, post=by_role(UNAUTHORIZED, FORBIDDEN, OK, FORBIDDEN, OK),
                              data="dataset_body", api=True),
    "api/v1/datasets/<int:pk>/": Entry("/api/v1/datasets/{dataset}/", get=API_READ, api=True),
    "api/v1/datasets/<int:pk>/catalogue/": Entry("/api/v1/datasets/{dataset}/catalogue/", get=API_POST_ONLY,
                                                 post=by_role(UNAUTHORIZED, FORBIDDEN, "202", FORBIDDEN, "202"), api=True),
    # As on the page: no worker to regenerate on, so a launcher's request is refused at its field (400).
    "api/v1/datasets/<int:pk>/regenerate/": Entry("/api/v1/datasets/{dataset}/regenerate/", get=API_POST_ONLY,
                                                  post=by_role(UNAUTHORIZED, FORBIDDEN, "400", FORBIDDEN, "400"),
                                                  data="regenerate_form", api=True),
    "api/v1/compare/acceptance/": Entry("/api/v1/compare/acceptance/?ids={run},{other_run}", get=API_READ, api=True),
    "api/v1/targets/": Entry("/api/v1/targets/", get=API_READ, api=True),
    "api/v1/targets/inspect/": Entry("/api/v1/targets/inspect/?path={target_path}", get=API_READ, api=True),
    "api/v1/sweeps/<int:pk>/": Entry("/api/v1/sweeps/{sweep}/", get=API_READ, api=True),
    "api/v1/reports/": Entry("/api/v1/reports/", get=API_READ, post=by_role(UNAUTHORIZED, "201", "201", "201", "201"),
                             data="report_body", api=True),
    "api/v1/reports/<int:pk>/": Entry("/api/v1/reports/{report}/", get=API_READ, api=True),
    # A rule is anyone's own; the detail URL only deletes (DELETE is tests/api's), so GET and POST are refused.
    # Anyone's own alerts (what their bell shows); marking read takes {"id"} or nothing (all of them).
    "api/v1/alerts/": Entry("/api/v1/alerts/", get=API_READ, api=True),
    "api/v1/alerts/read/": Entry("/api/v1/alerts/read/", get=API_POST_ONLY, post=by_role(UNAUTHORIZED, "200", "200", "200", "200"),
                                 api=True),
    "api/v1/alert-rules/": Entry("/api/v1/alert-rules/", get=API_READ, post=by_role(UNAUTHORIZED, "201", "201", "201", "201"),
                                 data="alert_rule_body", api=True),
    "api/v1/alert-rules/<int:pk>/": Entry("/api/v1/alert-rules/{alert_rule}/", get=API_POST_ONLY, post=API_POST_ONLY,
                                          api=True),
    "api/v1/workers/": Entry("/api/v1/workers/", get=API_READ, api=True),
    "api/v1/me/": Entry("/api/v1/me/", get=API_READ, api=True),
    "api/v1/.*$": Entry("/api/v1/no-such-thing/", get=by_role(UNAUTHORIZED, NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND),
                        post=by_role(UNAUTHORIZED, NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND), api=True),
}
