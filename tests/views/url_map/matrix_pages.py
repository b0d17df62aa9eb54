"""The authorization matrix's entries for the web pages and the admin site: a page's entry per URL pattern,
and the rules by which every admin URL of a model is expected to answer. Its own module, as the API's
entries are matrix_api.py's, so that tests/views/url_map/test_authorization_matrix.py keeps the world and the tests."""
from __future__ import annotations

from tests.views.url_map.matrix_vocabulary import (ADMIN_OK, ANY_LOGIN, FORBIDDEN, LAUNCHERS, LAUNCHERS_PAGE, LOGIN,
                                                   NOT_ALLOWED, NOT_FOUND, OK, OWNERS, POST_ONLY, READ, REDIRECT,
                                                   REVIEWERS, STAFF, STAFF_WRITE, VERIFIERS, Entry, by_role)

# The web pages' URLs, one entry per pattern of the URL map (the API's are matrix_api.py's).
PAGES = {
    "login/": Entry("/login/", get=by_role(OK, OK, OK, OK, OK)),
    # Logging out is a POST (Django 5); it lands on the login page.
    "logout/": Entry("/logout/", get=by_role(LOGIN, NOT_ALLOWED, NOT_ALLOWED, NOT_ALLOWED, NOT_ALLOWED),
                     post=by_role(LOGIN, LOGIN, LOGIN, LOGIN, LOGIN)),
    "": Entry("/", get=READ),
    "runs/new/": Entry("/runs/new/", get=LAUNCHERS_PAGE, post=LAUNCHERS, data="launch_form"),
    # Building a failed demo again: anyone signed in (it writes only the demo's own folder). The world has no
    # failed build: the POST is answered with a message and queues nothing.
    "demo/build/": Entry("/demo/build/", get=POST_ONLY, post=by_role(LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT)),
    "runs/<int:pk>/": Entry("/runs/{run}/", get=READ),
    "runs/<int:pk>/cancel/": Entry("/runs/{run}/cancel/", get=POST_ONLY, post=OWNERS),
    "runs/<int:pk>/retry/": Entry("/runs/{run}/retry/", get=POST_ONLY, post=OWNERS),
    "runs/<int:pk>/tags/": Entry("/runs/{run}/tags/", get=POST_ONLY, post=OWNERS, data="tags_form"),
    "runs/compare/": Entry("/runs/compare/?ids={run},{other_run}", get=READ),
    # Ticked runs tagged or archived: the admin's runs, in the open project, are its owner's and admins'.
    "runs/bulk/": Entry("/runs/bulk/", get=POST_ONLY, post=OWNERS, data="bulk_form"),
    # A saved view is anyone's own; the admin's, not shared, is no one else's to find (404).
    "views/": Entry("/views/", get=POST_ONLY, post=by_role(LOGIN, REDIRECT, REDIRECT, REDIRECT, REDIRECT), data="view_form"),
    "views/<int:pk>/delete/": Entry("/views/{saved_view}/delete/", get=POST_ONLY,
                                    post=by_role(LOGIN, NOT_FOUND, NOT_FOUND, NOT_FOUND, REDIRECT)),
    # Creating a project: launchers and admins (the API's rule); the list shows only one's own projects.
    "projects/": Entry("/projects/", get=READ, post=LAUNCHERS, data="project_body"),
    "sweeps/": Entry("/sweeps/", get=READ),
    "sweeps/<int:pk>/": Entry("/sweeps/{sweep}/", get=READ),
    # The sweep's runs are the admin's: cancelling them is their owner's or an admin's.
    "sweeps/<int:pk>/cancel/": Entry("/sweeps/{sweep}/cancel/", get=POST_ONLY, post=OWNERS),
    "workers/": Entry("/workers/", get=READ),
    "datasets/": Entry("/datasets/", get=READ),
    "datasets/<int:pk>/": Entry("/datasets/{dataset}/", get=READ),
    "datasets/<int:pk>/catalogue/": Entry("/datasets/{dataset}/catalogue/", get=POST_ONLY, post=LAUNCHERS),
    # The world has no worker to regenerate on: a launcher's request is refused on the form, saying so (400).
    "datasets/<int:pk>/regenerate/": Entry("/datasets/{dataset}/regenerate/", get=POST_ONLY,
                                           post=by_role(LOGIN, FORBIDDEN, "400", FORBIDDEN, "400"), data="regenerate_form"),
    # A regeneration is its requester's and the admins' to cancel or retry; the world's asked for by nobody.
    "regenerations/<int:pk>/cancel/": Entry("/regenerations/{regeneration}/cancel/", get=POST_ONLY, post=OWNERS),
    "regenerations/<int:pk>/retry/": Entry("/regenerations/{regeneration}/retry/", get=POST_ONLY, post=OWNERS),
    "extractions/": Entry("/extractions/", get=READ),
    "extractions/import/": Entry("/extractions/import/", get=LAUNCHERS_PAGE, post=LAUNCHERS, data="import_form"),
    "extractions/<int:pk>/": Entry("/extractions/{extraction}/", get=READ),
    "extractions/<int:pk>/verify/": Entry("/extractions/{extraction}/verify/", get=POST_ONLY, post=VERIFIERS),
    "extractions/<int:pk>/override/": Entry("/extractions/{extraction}/override/", get=POST_ONLY, post=REVIEWERS,
                                            data="override_form"),
    "checkpoints/<int:pk>/": Entry("/checkpoints/{checkpoint}/", get=READ),
    "checkpoints/<int:pk>/evaluate/": Entry("/checkpoints/{checkpoint}/evaluate/", get=POST_ONLY, post=LAUNCHERS,
                                            data="evaluate_form"),
    "checkpoints/<int:pk>/serve-check/": Entry("/checkpoints/{checkpoint}/serve-check/", get=POST_ONLY, post=LAUNCHERS),
    # Refused past the roles (its folder does not exist): a message on the checkpoint's page.
    "checkpoints/<int:pk>/export/": Entry("/checkpoints/{checkpoint}/export/", get=POST_ONLY, post=LAUNCHERS),
    # Anyone signed in may comment (tests/views/review/test_reviews.py); the matrix tries an approval.
    "reviews/<str:subject>/<int:pk>/": Entry("/reviews/extraction/{extraction}/", get=POST_ONLY, post=REVIEWERS,
                                             data="approve_form"),
}

# The admin site: its own login and logout, and everything else for staff only, whatever the model
# (a model registered later is covered by the same rule). A POST (add, change, delete) by anyone
# else goes to the admin's login and changes nothing.
ADMIN = {
    "admin/login/": Entry("/admin/login/", get=by_role(OK, OK, OK, OK, ADMIN_OK)),
    "admin/logout/": Entry("/admin/logout/", get=by_role(ANY_LOGIN, REDIRECT, REDIRECT, REDIRECT, NOT_ALLOWED)),
    "admin/r/<path:content_type_id>/<path:object_id>/": Entry("/admin/r/{run_content_type}/{run}/", get=STAFF),
    "admin/(?P<app_label>auth|axes|runs)/$": Entry("/admin/runs/", get=STAFF),
    "admin/(?P<url>.*)$": Entry("/admin/no-such-page/", get={**STAFF, "admin": NOT_FOUND}),
    # Without its query (app_label, model_name, field_name) the autocomplete refuses even staff.
    "admin/autocomplete/": Entry("/admin/autocomplete/", get={**STAFF, "admin": FORBIDDEN}),
    "admin/auth/user/<id>/password/": Entry("/admin/auth/user/{admin_user}/password/", get=STAFF,
                                            post=STAFF_WRITE),
}
# The curation log and the API's are audit trails: nobody adds or edits their rows, not even staff;
# nor a token (made where its secret can be shown once: the account page, create_api_token).
AUDIT_LOGS = {"runs.curationaction", "runs.apiauditentry", "runs.apitoken"}
# A launch's Idempotency-Key is written by the launch it guards (runs.api.bodies.idempotency): read-only likewise.
WRITTEN_BY_LAUNCHES = {"runs.launchidempotencykey"}
# Rows a service writes after its checks (a target read from its config.json, a dataset registered and
# catalogued, a run launched with its stages, an import, a heartbeat, an override of a failed check):
# staff edit and delete them in the admin, but add none (runs/admin.py's NoAddAdmin).
# A report (every save a version) and a saved view (its parameters checked) are written through their pages
# and the API likewise.
WRITTEN_BY_SERVICES = {"runs.targetmodel", "runs.dataset", "runs.datasetsample", "runs.pipelinerun", "runs.sweep",
                       "runs.extraction", "runs.checkpoint", "runs.verificationoverride", "runs.worker",
                       "runs.report", "runs.savedview", "runs.evalsuite"}
# Rows only workers and services write, read-only in the admin: the bookkeeping off its index (stage
# records, attempts, jobs, metrics, manifests, a sweep's runs: runs/admin.py's InternalAdmin), the
# outbox and alert rules (listed, so that staff can delete a row; a rule's webhook was checked when made), what a
# verification measured, alerts with their notices and deliveries, the stall watch, a report's versions.
READ_ONLY = {"runs.preparation", "runs.extractstage", "runs.vocabmapping", "runs.trainingrun", "runs.stageattempt",
             "runs.datasetcatalogue", "runs.demobuild", "runs.verificationrequest", "runs.servecheck", "runs.datasetregeneration",
             "runs.evaluation", "runs.metricseries", "runs.metricchunk", "runs.manifest", "runs.sweeprun",
             "runs.pendingenqueue", "runs.verification", "runs.checkpointgenerations", "runs.alertrule",
             "runs.alert", "runs.alertnotice", "runs.alertdelivery", "runs.stagewatch", "runs.reportversion",
             "runs.stageshard", "runs.trainingnode"}
# The sign-in throttle's records (django-axes): written by failed sign-ins only; the admin reads and
# deletes them (deleting an attempt lifts its lockout) but adds none.
WRITTEN_BY_SIGN_INS = {"axes.accessattempt", "axes.accesslog", "axes.accessfailurelog"}
# Other admin URLs by shape; <path:object_id> is the first row of the model (or a missing id).
ADMIN_SHAPES = {
    "": STAFF, "password_change/": STAFF, "password_change/done/": STAFF, "jsi18n/": STAFF,
    "{model}/": STAFF, "{model}/add/": STAFF, "{model}/<path:object_id>/history/": STAFF,
    "{model}/<path:object_id>/delete/": STAFF, "{model}/<path:object_id>/change/": STAFF,
    "{model}/<path:object_id>/": STAFF,
}
ADMIN_WRITES = ("add/", "delete/", "change/", "password_change/")
