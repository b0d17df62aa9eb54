"""The project wall's entries (tests/views/projects/test_project_wall.py): per pattern of the URL map, what object of
runs.projects.access.KINDS it names and which action of access.ACTIONS it takes, as one or more probes.

A probe's URL holds {id}, the object's id: the test asks it with an object of the user's own project, one of
the other project and an id that does not exist, and reads runs.projects.access.rule for what each role
should get. A pattern that names no object (a list, a form, one's own reports, rules and tokens) is probed
with GET for names of the other project, which no one but staff may read there. The admin site is for staff
only (tests/views/url_map/test_authorization_matrix.py). A pattern of the URL map without an entry here fails.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    url: str  # {id}: the object's; {own_run}: a run of the user's own project
    kind: str | None = None  # runs.projects.access.KINDS; None: nothing named, a read for leaks
    action: str = "read"
    method: str = "GET"
    api: bool = False  # with the role's token and a JSON body
    data: str = ""  # a body: BODIES[data](id, the target's id)


def page(url: str, kind: str | None = None, action: str = "read", method: str = "GET", data: str = "") -> tuple[Probe]:
    return (Probe(url, kind, action, method, False, data),)


def api(url: str, kind: str | None = None, action: str = "read", method: str = "GET", data: str = "") -> tuple[Probe]:
    return (Probe(url, kind, action, method, True, data),)


BODIES = {
    "tags": lambda pk, target: {"tags": "wall"},
    "tags_json": lambda pk, target: {"tags": ["wall"]},
    "bulk": lambda pk, target: {"ids": [pk], "action": "archive"},
    "override": lambda pk, target: {"reason": "a known false alarm"},
    "evaluate": lambda pk, target: {"max_new_tokens": 8, "max_prompts": 2},
    "review": lambda pk, target: {"decision": "approve", "text": "looks right"},
    "regenerate": lambda pk, target: {"target": target, "backend": "transformers", "max_new_tokens": 16, "temperature": 0, "seed": 0},
    "baseline": lambda pk, target: {"event": "tau_below", "baseline_run": pk},
    "points": lambda pk, target: {"points": [{"key": "loss_0", "split": "train", "step": 1, "value": 1.5}]},
    "checkpoint": lambda pk, target: {"path": "/nowhere/ckpt", "epoch": 0},
    "end": lambda pk, target: {"status": "succeeded", "message": "wall"},
    "empty": lambda pk, target: {},
}

RUN_POST = dict(kind="run", action="act", method="POST")

WALL = {
    "login/": page("/login/"),
    "logout/": page("/logout/"),
    "": page("/?q=wall"),
    "runs/new/": page("/runs/new/?copy={id}", "run", "copy") + page("/runs/new/?copy={id}&more_data=1", "run", "copy"),
    "demo/build/": page("/demo/build/"),
    "runs/<int:pk>/": page("/runs/{id}/", "run"),
    "runs/<int:pk>/cancel/": page("/runs/{id}/cancel/", **RUN_POST),
    "runs/<int:pk>/retry/": page("/runs/{id}/retry/", **RUN_POST),
    "runs/<int:pk>/tags/": page("/runs/{id}/tags/", **RUN_POST, data="tags"),
    "runs/compare/": page("/runs/compare/?ids={own_run},{id}", "run"),
    "runs/bulk/": page("/runs/bulk/", **RUN_POST, data="bulk"),
    "views/": page("/views/"),
    "views/<int:pk>/delete/": page("/views/1/delete/"),
    "sweeps/": page("/sweeps/"),
    "sweeps/<int:pk>/": page("/sweeps/{id}/", "sweep"),
    "sweeps/<int:pk>/cancel/": page("/sweeps/{id}/cancel/", "sweep", "act", "POST"),
    "workers/": page("/workers/"),
    "datasets/": page("/datasets/"),
    "datasets/<int:pk>/": page("/datasets/{id}/", "dataset"),
    "datasets/<int:pk>/catalogue/": page("/datasets/{id}/catalogue/", "dataset", "catalogue", "POST"),
    "datasets/<int:pk>/regenerate/": page("/datasets/{id}/regenerate/", "dataset", "regenerate", "POST", "regenerate"),
    "regenerations/<int:pk>/cancel/": page("/regenerations/{id}/cancel/", "regeneration", "act", "POST"),
    "regenerations/<int:pk>/retry/": page("/regenerations/{id}/retry/", "regeneration", "act", "POST"),
    "extractions/": page("/extractions/"),
    "extractions/import/": page("/extractions/import/"),
    "extractions/<int:pk>/": page("/extractions/{id}/", "extraction"),
    "extractions/<int:pk>/verify/": page("/extractions/{id}/verify/", "extraction", "verify", "POST"),
    "extractions/<int:pk>/override/": page("/extractions/{id}/override/", "extraction", "override", "POST", "override"),
    "checkpoints/<int:pk>/": page("/checkpoints/{id}/", "checkpoint"),
    "checkpoints/<int:pk>/evaluate/": page("/checkpoints/{id}/evaluate/", "checkpoint", "evaluate", "POST", "evaluate"),
    "checkpoints/<int:pk>/serve-check/": page("/checkpoints/{id}/serve-check/", "checkpoint", "evaluate", "POST"),
    "checkpoints/<int:pk>/export/": page("/checkpoints/{id}/export/", "checkpoint", "export", "POST"),
    # A project's page answers its members (tests/views/projects/test_project_members.py); read here for names.
    "projects/<int:pk>/": page("/projects/1/"),
    "projects/": page("/projects/"),
    "reviews/<str:subject>/<int:pk>/": (page("/reviews/run/{id}/", "run", "review", "POST", "review")
                                        + page("/reviews/checkpoint/{id}/", "checkpoint", "review", "POST", "review")
                                        + page("/reviews/extraction/{id}/", "extraction", "review", "POST", "review")),
    "alerts/": page("/alerts/"),
    "alerts/read/": page("/alerts/read/"),
    "alerts/rules/": page("/alerts/rules/") + page("/alerts/rules/", "run", "baseline", "POST", "baseline"),
    "alerts/rules/<int:pk>/delete/": page("/alerts/rules/1/delete/"),
    "reports/": page("/reports/"),
    "reports/new/": page("/reports/new/"),
    "reports/<int:pk>/": page("/reports/1/"),
    "reports/<int:pk>/edit/": page("/reports/1/edit/"),
    "reports/<int:pk>/versions/": page("/reports/1/versions/"),
    "reports/<int:pk>/versions/<int:number>/": page("/reports/1/versions/1/"),
    "reports/<int:pk>/export/": page("/reports/1/export/"),
    "account/": page("/account/"),
    "account/tokens/<int:pk>/revoke/": page("/account/tokens/1/revoke/"),
    "account/team/": page("/account/team/"),
    "api/v1/": page("/api/v1/"),
    "api/v1/openapi.json": api("/api/v1/openapi.json"),
    "api/v1/runs/": api("/api/v1/runs/?q=wall") + api("/api/v1/runs/"),
    "api/v1/projects/": api("/api/v1/projects/"),
    "api/v1/projects/<int:pk>/members/": api("/api/v1/projects/1/members/"),
    "api/v1/projects/<int:pk>/members/<str:username>/": api("/api/v1/projects/1/members/nobody/"),
    "api/v1/saved-views/": api("/api/v1/saved-views/"),
    "api/v1/runs/<int:pk>/": api("/api/v1/runs/{id}/", "run"),
    "api/v1/runs/<int:pk>/status/": api("/api/v1/runs/{id}/status/", "run"),
    "api/v1/runs/<int:pk>/cancel/": api("/api/v1/runs/{id}/cancel/", **RUN_POST),
    "api/v1/runs/<int:pk>/retry/": api("/api/v1/runs/{id}/retry/", **RUN_POST),
    "api/v1/runs/<int:pk>/tags/": api("/api/v1/runs/{id}/tags/", **RUN_POST, data="tags_json"),
    "api/v1/runs/<int:pk>/keep-cache/": api("/api/v1/runs/{id}/keep-cache/", **RUN_POST),
    "api/v1/runs/<int:pk>/copy/": api("/api/v1/runs/{id}/copy/", "run", "copy", "POST", "empty"),
    "api/v1/runs/<int:pk>/stages/": api("/api/v1/runs/{id}/stages/", "run"),
    "api/v1/runs/<int:pk>/attempts/": api("/api/v1/runs/{id}/attempts/", "run"),
    "api/v1/runs/<int:pk>/metrics/": (api("/api/v1/runs/{id}/metrics/", "run")
                                      + api("/api/v1/runs/{id}/metrics/", **RUN_POST, data="points")),
    "api/v1/runs/<int:pk>/checkpoints/": api("/api/v1/runs/{id}/checkpoints/", **RUN_POST, data="checkpoint"),
    "api/v1/runs/<int:pk>/end/": api("/api/v1/runs/{id}/end/", **RUN_POST, data="end"),
    "api/v1/runs/<int:pk>/metrics/export/": api("/api/v1/runs/{id}/metrics/export/?key=loss&split=train", "run"),
    "api/v1/checkpoints/<int:pk>/": api("/api/v1/checkpoints/{id}/", "checkpoint"),
    "api/v1/checkpoints/<int:pk>/generations/": api("/api/v1/checkpoints/{id}/generations/", "checkpoint"),
    "api/v1/checkpoints/<int:pk>/export/": api("/api/v1/checkpoints/{id}/export/", "checkpoint", "export", "POST",
                                               "empty"),
    "api/v1/checkpoints/<int:pk>/evaluate/": api("/api/v1/checkpoints/{id}/evaluate/", "checkpoint", "evaluate", "POST",
                                                 "evaluate"),
    "api/v1/extractions/": api("/api/v1/extractions/"),
    "api/v1/extractions/<int:pk>/": api("/api/v1/extractions/{id}/", "extraction"),
    "api/v1/extractions/<int:pk>/verify/": api("/api/v1/extractions/{id}/verify/", "extraction", "verify", "POST", "empty"),
    "api/v1/datasets/": api("/api/v1/datasets/"),
    "api/v1/datasets/<int:pk>/": api("/api/v1/datasets/{id}/", "dataset"),
    "api/v1/datasets/<int:pk>/catalogue/": api("/api/v1/datasets/{id}/catalogue/", "dataset", "catalogue", "POST", "empty"),
    "api/v1/datasets/<int:pk>/regenerate/": api("/api/v1/datasets/{id}/regenerate/", "dataset", "regenerate", "POST",
                                                "regenerate"),
    "api/v1/compare/acceptance/": api("/api/v1/compare/acceptance/?ids={own_run},{id}", "run"),
    "api/v1/targets/": api("/api/v1/targets/"),
    "api/v1/targets/inspect/": api("/api/v1/targets/inspect/?path=/nowhere"),
    "api/v1/sweeps/<int:pk>/": api("/api/v1/sweeps/{id}/", "sweep"),
    "api/v1/reports/": api("/api/v1/reports/"),
    "api/v1/reports/<int:pk>/": api("/api/v1/reports/1/"),
    "api/v1/alerts/": api("/api/v1/alerts/"),
    "api/v1/alerts/read/": api("/api/v1/alerts/read/"),
    "api/v1/alert-rules/": api("/api/v1/alert-rules/") + api("/api/v1/alert-rules/", "run", "baseline", "POST", "baseline"),
    "api/v1/alert-rules/<int:pk>/": api("/api/v1/alert-rules/1/"),
    "api/v1/workers/": api("/api/v1/workers/"),
    "api/v1/me/": api("/api/v1/me/"),
    "api/v1/.*$": api("/api/v1/no-such-thing/"),
}
