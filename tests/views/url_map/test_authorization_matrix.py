"""Every URL of the URL map against every role, anonymous included.

The URL map is walked recursively, so a URL added without an entry (matrix_pages.py for the pages and
the admin site, matrix_api.py for the API) fails `test_every_url_has_an_entry`. Each entry states, per role, what a GET
answers and, for a URL that changes state, what a POST answers; a refused POST must leave the database as it was.

Roles come from runs/roles.py: viewer reads; launcher launches, imports, evaluates and verifies, and
cancels, retries and tags its own runs (the world's runs are the admin's: a launcher is refused them,
tests/api/runs/test_run_ownership.py has the rest of that rule); reviewer verifies, reviews and overrides;
admin (a staff superuser) does everything, and only staff reach the admin site.

The API (/api/v1/) is asked with each role's token (anonymous: none) and JSON bodies, and answers
with status codes, 401 for no token.
"""
from __future__ import annotations

import json
import re

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from runs.pipeline import services
from runs.data.extractions import extraction_import
from runs.pipeline.jobs.models import DatasetCatalogue, DatasetRegeneration, VerificationRequest
from runs.tracking.services import metrics_record
from runs.models import (Checkpoint, CurationAction, Evaluation, PendingEnqueue, PipelineRun, Review,
                         StageAttempt, Verification, VerificationOverride)
from runs.pipeline.lifecycle.stages import STAGES
from runs.pipeline.launch.run_config import RunConfig
from tests.views.url_map.matrix_api import API
from tests.views.url_map.matrix_pages import (ADMIN, ADMIN_SHAPES, ADMIN_WRITES, AUDIT_LOGS, PAGES, READ_ONLY,
                                              WRITTEN_BY_LAUNCHES, WRITTEN_BY_SERVICES, WRITTEN_BY_SIGN_INS)
from tests.views.url_map.matrix_vocabulary import (ADMIN_LOGIN, ADMIN_OK, ANY_LOGIN, FORBIDDEN, LOGIN, NOT_ALLOWED,
                                                   NOT_TRIED, OK, REDIRECT, ROLES, STAFF, STAFF_WRITE, UNAUTHORIZED,
                                                   Entry)

pytestmark = pytest.mark.django_db


# The app's URLs, one entry per pattern of the URL map: the pages', then the API's.
APP = {**PAGES, **API}
MODEL_ROUTE = re.compile(r"^admin/(?P<app>\w+)/(?P<model>\w+)/(?P<rest>.*)$")


def walk(resolver: URLResolver, prefix: str = ""):
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            yield from walk(pattern, prefix + str(pattern.pattern).lstrip("^"))
        else:
            assert isinstance(pattern, URLPattern)
            # As resolve() spells a route: a nested regex loses its leading ^.
            yield prefix + str(pattern.pattern).lstrip("^")


ROUTES = list(dict.fromkeys(walk(get_resolver())))


def entry_for(route: str, world: World) -> Entry | None:
    if route in APP:
        return APP[route]
    if route in ADMIN:
        return ADMIN[route]
    match = MODEL_ROUTE.match(route)
    if match:
        try:
            model = apps.get_model(match["app"], match["model"])
        except LookupError:
            model = None
        rest = match["rest"]
        if model is not None and "{model}/" + rest in ADMIN_SHAPES:
            row = model._default_manager.order_by("pk").first()
            url = f"/admin/{match['app']}/{match['model']}/" + rest.replace("<path:object_id>", str(row.pk if row else 10**9))
            get, post = ADMIN_SHAPES["{model}/" + rest], STAFF_WRITE if rest.endswith(ADMIN_WRITES) else None
            if model._meta.label_lower in WRITTEN_BY_SIGN_INS and rest.endswith("add/"):
                get, post = {**get, "admin": FORBIDDEN}, {**STAFF, "admin": FORBIDDEN}
            read_only = AUDIT_LOGS | WRITTEN_BY_LAUNCHES | READ_ONLY
            if model._meta.label_lower in read_only | WRITTEN_BY_SERVICES and rest.endswith("add/"):
                get, post = {**get, "admin": FORBIDDEN}, {**STAFF, "admin": FORBIDDEN}
            if model._meta.label_lower in read_only and rest.endswith("change/"):
                post = {**STAFF, "admin": FORBIDDEN}  # shown (GET), not saved
            return Entry(url, get=get, post=post)
    if route.startswith("admin/") and route[len("admin/"):] in ADMIN_SHAPES:
        rest = route[len("admin/"):]
        return Entry("/" + route, get=ADMIN_SHAPES[rest], post=STAFF_WRITE if rest.endswith(ADMIN_WRITES) else None)
    return None


class World:
    """One of everything a URL can name, and a user per role."""

    def __init__(self, tmp_path, config_only_target):
        users = get_user_model()
        self.users = {}
        for role in ROLES[1:4]:
            account = users.objects.create_user(f"matrix-{role}")
            account.groups.add(Group.objects.get_or_create(name=role)[0])
            self.users[role] = account
        self.users["admin"] = users.objects.create_superuser("matrix-admin", password=None)
        self.users["admin"].groups.add(Group.objects.get_or_create(name="admin")[0])
        self.target = config_only_target
        self.dataset_path = tmp_path / "chats.jsonl"
        chat = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
        self.dataset_path.write_text(json.dumps(chat) + "\n")
        self.run = services.run_launch(user=self.users["admin"], target_path=self.target,
                                       dataset_path=self.dataset_path, config=RunConfig(draft_vocab_size=64))
        self.other_run = services.run_launch(user=self.users["admin"], target_path=self.target,
                                             dataset_path=self.dataset_path, config=RunConfig(draft_vocab_size=32))
        from tests.contract.test_verify import write_flat

        self.tmp_path = tmp_path
        self.extraction, _ = extraction_import(path=write_flat(tmp_path / "matrix-ext"), target_path=self.target)
        # A failed latest verification, so that an override has something to override.
        Verification.objects.create(extraction=self.extraction, full=False, passed=False, layout="flat_v1",
                                    checks=[], report={}, seconds=0.0)
        training = self.run.training_run
        self.checkpoint = Checkpoint.objects.create(training_run=training, epoch=0, path=str(tmp_path / "ckpt-0"))
        metrics_record(training_run_id=training.pk,
                       points=[{"split": "train", "key": "loss", "step": 1, "epoch": 0.1, "value": 1.0}])
        StageAttempt.objects.create(run=self.run, stage="prepare", record_id=self.run.preparation.pk, number=1,
                                    worker="w", started_at=self.run.created_at)
        Review.objects.create(author=self.users["viewer"], decision="comment", text="a note", run=self.run)
        CurationAction.objects.create(user=self.users["admin"], dataset=self.run.dataset, action="edit")
        failed = Verification.objects.filter(passed=False).first()
        VerificationOverride.objects.create(verification=failed, reviewer=self.users["admin"], reason="seed")
        self.import_count = 0
        self.regeneration = DatasetRegeneration.objects.create(
            source=self.run.dataset, source_path=str(self.dataset_path), target=self.run.target, backend="transformers",
            max_new_tokens=16, settings_key="matrix", output_path=str(tmp_path / "regenerated" / "out.jsonl"))
        from runs.sweeps.services import sweep_launch
        from runs.sweeps.spec import parse_vary

        self.sweep = sweep_launch(user=self.users["admin"], target_path=self.target, dataset_path=self.dataset_path,
                                  config=RunConfig(draft_vocab_size=64), varied=[parse_vary("seed=1,2")])
        from runs.pipeline.launch.external import external_run_create

        self.external_run = external_run_create(user=self.users["admin"], name="matrix elsewhere", config={"epochs": 1})
        from runs.api.tokens import token_create

        self.tokens = {role: token_create(user=user, name="matrix")[1] for role, user in self.users.items()}
        from runs.saved_views.services import saved_view_save

        self.saved_view = saved_view_save(user=self.users["admin"], name="admin's view", params={"tag": "matrix"})
        self.project_count = 0
        from runs.alerts.services import RuleInput, rule_create
        from runs.reports.services import report_create

        self.report = report_create(user=self.users["admin"], title="m", body="# m")
        self.alert_rule = rule_create(user=self.users["admin"], data=RuleInput(event="run_failed"))
        self.spare_token, _ = token_create(user=self.users["admin"], name="spare")

    def ids(self) -> dict:
        return {"run": self.run.pk, "other_run": self.other_run.pk, "dataset": self.run.dataset_id, "extraction": self.extraction.pk,
                "checkpoint": self.checkpoint.pk, "regeneration": self.regeneration.pk, "target_path": str(self.target),
                "sweep": self.sweep.pk, "spare_token": self.spare_token.pk, "external_run": self.external_run.pk,
                "admin_user": self.users["admin"].pk, "saved_view": self.saved_view.pk,
                "report": self.report.pk, "alert_rule": self.alert_rule.pk, "project": self.run.project_id,
                "run_content_type": ContentType.objects.get_for_model(PipelineRun).pk}

    def launch_form(self) -> dict:
        return {"target_path": str(self.target), "dataset_path": str(self.dataset_path), "layer_ids": "",
                "max_seq_len": 512, "draft_vocab_size": 64, "epochs": 1, "lr": 0.0003, "ttt_steps": 3}

    def launch_body(self) -> dict:
        return {"target": str(self.target), "dataset": str(self.dataset_path), "draft_vocab_size": 64, "epochs": 1}

    def import_body(self) -> dict:
        form = self.import_form()
        return {"path": form["path"], "target": form["target_path"]}

    def dataset_body(self) -> dict:
        return {"path": str(self.dataset_path)}

    def points_body(self) -> dict:
        return {"points": [{"key": "loss_0", "split": "train", "step": 1, "value": 1.5}]}

    def checkpoint_body(self) -> dict:
        return {"path": str(self.tmp_path / "no-such-checkpoint"), "epoch": 0}

    def end_body(self) -> dict:
        return {"status": "succeeded", "message": "matrix"}

    def bulk_form(self) -> dict:
        return {"ids": [self.run.pk], "action": "archive"}

    def view_form(self) -> dict:
        return {"name": "matrix view", "query": "sort=name&tag=matrix"}

    def project_body(self) -> dict:
        self.project_count += 1
        return {"name": f"matrix project {self.project_count}"}

    def member_body(self) -> dict:
        return {"username": "matrix-viewer", "role": "editor"}

    def member_form(self) -> dict:
        return {"username": "matrix-viewer", "role": "viewer"}

    def saved_view_body(self) -> dict:
        return {"name": "matrix view", "params": {"sort": "-tau"}}

    def report_form(self) -> dict:
        return {"title": "t", "body": "b"}

    def report_body(self) -> dict:
        return self.report_form()

    def alert_rule_form(self) -> dict:
        return {"event": "run_failed"}

    def alert_rule_body(self) -> dict:
        return self.alert_rule_form()

    def tags_body(self) -> dict:
        return {"tags": ["baseline", "matrix"]}

    def token_form(self) -> dict:
        return {"name": "matrix page"}

    def import_form(self) -> dict:
        from tests.contract.test_verify import write_flat

        self.import_count += 1
        path = write_flat(self.tmp_path / f"matrix-import-{self.import_count}")
        return {"path": str(path), "target_path": str(self.target)}

    def regenerate_form(self) -> dict:
        return {"target": self.run.target_id, "backend": "transformers", "max_new_tokens": 16, "temperature": 0,
                "seed": 0}

    def tags_form(self) -> dict:
        return {"tags": "baseline, matrix"}

    def override_form(self) -> dict:
        return {"reason": "the failed check is a known false alarm"}

    def evaluate_form(self) -> dict:
        return {"max_new_tokens": 8, "max_prompts": 2}

    def approve_form(self) -> dict:
        return {"decision": "approve", "text": "Shapes and totals match."}

    def client(self, role: str) -> Client:
        client = Client()
        if role != "anonymous":
            client.force_login(self.users[role])
        return client

    def api_client(self, role: str) -> Client:
        """No session: the role's token on every request, as a script sends it."""
        return Client(HTTP_AUTHORIZATION=f"Bearer {self.tokens[role]}") if role != "anonymous" else Client()


def fingerprint() -> tuple:
    """What a refused request must leave as it was: the rows of every table of the app and the users,
    counted in one query, and every stage's status. The API's audit trail records refused requests too."""
    tables = [m._meta.db_table for m in apps.get_app_config("runs").get_models()
              if m._meta.label_lower != "runs.apiauditentry"] + [get_user_model()._meta.db_table]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(f'(SELECT count(*) FROM "{t}")' for t in tables))
        counts = cursor.fetchone()
    stages = [list(s.model.objects.order_by("pk").values_list("status", flat=True)) for s in STAGES]
    return counts, stages


def outcome(response) -> str:
    code = response.status_code
    if code in (301, 302):
        location = response["Location"]
        if location.startswith("/login/"):
            return LOGIN
        if location.startswith("/admin/login/"):
            return ADMIN_LOGIN
        return REDIRECT
    return str(code)


def matches(expected: str, got: str) -> bool:
    if expected == ADMIN_OK:
        return got in (OK, REDIRECT)
    if expected == ANY_LOGIN:
        return got in (LOGIN, ADMIN_LOGIN)
    return expected == got


@pytest.fixture
def world(tmp_path, config_only_target):
    return World(tmp_path, config_only_target)


def test_every_url_has_an_entry(world):
    missing = [route for route in ROUTES if entry_for(route, world) is None]
    assert missing == [], f"URLs without an entry in the authorization matrix: {missing}"
    stale = [route for route in [*APP, *ADMIN] if route not in ROUTES]
    assert stale == [], f"entries for URLs the URL map no longer has: {stale}"


def test_the_admin_categories_name_registered_models():
    """A model renamed or unregistered leaves no stale rule behind, and none is in two categories."""
    from django.contrib import admin

    registered = {m._meta.label_lower for m in admin.site._registry}
    categories = [AUDIT_LOGS, WRITTEN_BY_LAUNCHES, WRITTEN_BY_SERVICES, READ_ONLY, WRITTEN_BY_SIGN_INS]
    assert set().union(*categories) - registered == set()
    assert sum(len(c) for c in categories) == len(set().union(*categories))


@pytest.mark.parametrize("route", ROUTES)
def test_url_answers_each_role_as_the_matrix_says(route, world):
    entry = entry_for(route, world)
    if entry is None:
        pytest.fail(f"{route!r} has no entry in the authorization matrix")
    failures = []
    for method, expected_by_role in (("GET", entry.get), ("POST", entry.post)):
        if expected_by_role is None:
            continue
        for role in ROLES:
            expected = expected_by_role[role]
            if expected == NOT_TRIED:
                continue
            url = entry.url.format(**world.ids())
            # The sample URL really is this pattern's (the catch-all would take a mistyped one).
            if resolve(url.split("?")[0]).route != route:
                failures.append(f"{url} does not resolve to {route}")
                break
            client = world.api_client(role) if entry.api else world.client(role)
            before = fingerprint() if method == "POST" else None
            data = getattr(world, entry.data)() if entry.data else {}
            if method == "GET":
                response = client.get(url)
            elif entry.api:
                response = client.post(url, json.dumps(data), content_type="application/json")
            else:
                response = client.post(url, data)
            got = outcome(response)
            if not matches(expected, got):
                failures.append(f"{method} {url} as {role}: expected {expected}, got {got}")
            if got == FORBIDDEN and route in APP:
                if b"may not" not in response.content:
                    failures.append(f"{method} {url} as {role}: the 403 page does not say why")
            asked_csv = "/export/" in url and response.status_code == 200  # a curve export's file
            if entry.api and not asked_csv and (response["Content-Type"] != "application/json" or (
                    response.status_code >= 400 and set(response.json()) != {"error", "fields"})):
                failures.append(f"{method} {url} as {role}: not the API's JSON ({response['Content-Type']})")
            if method == "POST" and expected in (LOGIN, ADMIN_LOGIN, FORBIDDEN, NOT_ALLOWED, UNAUTHORIZED):
                if fingerprint() != before:
                    failures.append(f"POST {url} as {role} was refused but changed the database")
    assert failures == [], "\n".join(failures)


def test_allowed_writes_are_stored(world):
    """The matrix's REDIRECT for an allowed POST is the write itself, not a refusal with a message."""
    launcher, reviewer = world.client("launcher"), world.client("reviewer")
    runs = PipelineRun.objects.count()
    launcher.post("/runs/new/", world.launch_form())
    assert PipelineRun.objects.count() == runs + 1
    evaluations = Evaluation.objects.count()
    launcher.post(f"/checkpoints/{world.checkpoint.pk}/evaluate/", world.evaluate_form())
    assert Evaluation.objects.count() == evaluations + 1
    catalogues = DatasetCatalogue.objects.count()
    launcher.post(f"/datasets/{world.run.dataset_id}/catalogue/")
    assert DatasetCatalogue.objects.count() in (catalogues, catalogues + 1)  # one already queued is reused
    assert DatasetCatalogue.objects.filter(dataset_id=world.run.dataset_id, status="queued").count() == 1
    Verification.objects.create(extraction=world.extraction, full=False, passed=False, layout="flat_v1", checks=[],
                                report={}, seconds=0.0)
    overrides = VerificationOverride.objects.count()
    reviewer.post(f"/extractions/{world.extraction.pk}/override/", world.override_form())
    assert VerificationOverride.objects.count() == overrides + 1
    # After the override: an override is refused while a verification is under way.
    requests = VerificationRequest.objects.count()
    reviewer.post(f"/extractions/{world.extraction.pk}/verify/")
    assert VerificationRequest.objects.filter(extraction=world.extraction, status="queued").count() == requests + 1
    reviewer.post(f"/reviews/extraction/{world.extraction.pk}/", world.approve_form())
    assert Review.objects.filter(decision="approve", author=world.users["reviewer"]).count() == 1
    own = PipelineRun.objects.get(owner=world.users["launcher"])  # a launcher acts on its own runs
    launcher.post(f"/runs/{own.pk}/cancel/")
    assert own.preparation.__class__.objects.get(run=own).status == "cancelled"
    assert PendingEnqueue.objects.filter(kind=PendingEnqueue.Kind.PIPELINE, object_id=own.pk).count() == 1
    launcher.post(f"/runs/{own.pk}/retry/")
    assert PendingEnqueue.objects.filter(kind=PendingEnqueue.Kind.PIPELINE, object_id=own.pk).count() == 2
