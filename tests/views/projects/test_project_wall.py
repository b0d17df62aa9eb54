"""A project is a wall: every route of the URL map, asked by each role about an object of its own project, of
another project and of no project at all (an id that does not exist), answers as runs.projects.access.rule
says (its table of role × object × action), and what is of the other project answers exactly as what does
not exist: the same status and the same words, the ids aside. Nothing names the other project's run, its
checkpoint's or extraction's folder, to anyone but staff.

Two closed projects: "alpha", where the viewer (project viewer), launcher (owner), reviewer (viewer) and
admin (the site's admin role, not staff: projects still apply; editor) are members, and "beta", of a
stranger. Staff see both. The entries per route are tests/views/projects/matrix_projects.py's; a route of the URL map
without one fails `test_every_route_is_on_the_wall`. Real views, PostgreSQL and services throughout.
"""
from __future__ import annotations

import json
import re

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.urls import resolve
from django.utils import timezone

from runs.api.tokens import token_create
from runs.fleet.services import worker_heartbeat
from runs.models import Checkpoint, Extraction, Preparation
from runs.pipeline import services
from runs.pipeline.jobs.models import DatasetRegeneration
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stages import STAGES
from runs.projects import access
from runs.projects.services import project_create, project_member_set
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary
from tests.views.projects.matrix_projects import BODIES, WALL
from tests.views.url_map.test_authorization_matrix import ROUTES

pytestmark = pytest.mark.django_db

MISSING = 987654321  # an id nothing has
# What only the other project's members and staff may read anywhere.
SECRETS = ("beta-hidden-run", "beta-ckpt-folder", "beta-extraction-folder", "beta-sweep")
MEMBERS = {"viewer": "viewer", "launcher": None, "reviewer": "viewer", "admin": "editor"}  # launcher: alpha's owner


class Wall:
    """Two projects, an object of each kind in each, and a user per role."""

    def __init__(self, roots):
        people = get_user_model().objects
        self.users = {}
        for role in (*MEMBERS, "stranger"):
            self.users[role] = people.create_user(f"wall-{role}")
            self.users[role].groups.add(Group.objects.get_or_create(name="launcher" if role == "stranger" else role)[0])
        self.users["staff"] = people.create_superuser("wall-staff", password=None)
        launcher, stranger = self.users["launcher"], self.users["stranger"]
        alpha = project_create(user=launcher, name="alpha")
        for role, project_role in MEMBERS.items():
            if project_role:
                project_member_set(project=alpha, user=launcher, username=f"wall-{role}", role=project_role)
        project_create(user=stranger, name="beta")
        self.own, self.other = {}, {}
        for mine, user, project, prefix in ((self.own, launcher, "alpha", "alpha"), (self.other, stranger, "beta", "beta")):
            run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                      config=RunConfig(), name=f"{prefix}-hidden-run" if prefix == "beta" else "alpha run",
                                      enqueue=False, project=project)
            mine["run"] = run.pk
            mine["checkpoint"] = Checkpoint.objects.create(training_run=run.training_run, epoch=0,
                                                           path=str(roots / f"{prefix}-ckpt-folder")).pk
            mine["extraction"] = Extraction.objects.create(target=run.target, path=str(roots / f"{prefix}-extraction-folder"),
                                                           produced_by=run.extract_stage, layer_ids=[1, 2]).pk
            mine["sweep"] = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                         config=RunConfig(), varied=[parse_vary("seed=1,2")], name=f"{prefix}-sweep",
                                         enqueue=False, project=project).pk
            mine["dataset"] = run.dataset_id
            mine["regeneration"] = DatasetRegeneration.objects.create(
                source=run.dataset, source_path=str(roots / "chats.jsonl"), target=run.target, backend="transformers",
                max_new_tokens=16, settings_key=prefix, output_path=str(roots / f"{prefix}-regenerated.jsonl"),
                requested_by=user).pk
        # The stranger's run is being prepared on a worker all can see.
        worker_heartbeat(name="cpu@wall", hostname="wall", capabilities={"gpus": []}, queues=["cpu"],
                         started_at=timezone.now())
        Preparation.objects.filter(run_id=self.other["run"]).update(status="running", worker="cpu@wall",
                                                                    started_at=timezone.now())
        self.target = run.target_id
        self.tokens = {role: token_create(user=user, name="wall")[1] for role, user in self.users.items()}

    def client(self, role: str, api: bool) -> Client:
        if api:
            return Client(HTTP_AUTHORIZATION=f"Bearer {self.tokens[role]}")
        client = Client()
        client.force_login(self.users[role])
        return client


@pytest.fixture
def wall(roots):
    return Wall(roots)


def normalized(text: str, pk: int) -> str:
    """An answer's words with the id asked about, and the per-request tokens, left out."""
    text = re.sub(r"[A-Za-z0-9]{32,}", "<token>", text)
    text = re.sub(r"\d\d:\d\d:\d\d(\.\d+)?", "<time>", text)
    return re.sub(rf"(?<![\d.]){pk}(?![\d.])", "<id>", text)


def ask(wall: Wall, role: str, probe, pk: int) -> tuple[int, str]:
    """(status, normalized words) of one request; a redirect's words are its target's and that page's."""
    client = wall.client(role, probe.api)
    url = probe.url.format(id=pk, own_run=wall.own["run"])
    data = BODIES[probe.data](pk, wall.target) if probe.data else {}
    if probe.method == "GET":
        response = client.get(url)
    elif probe.api:
        response = client.post(url, json.dumps(data), content_type="application/json")
    else:
        response = client.post(url, data)
    words = response.content.decode(errors="replace")
    if response.status_code in (301, 302):  # where it sends one, and what it says there
        location = response["Location"]
        said = re.findall(r'<div class="message[^"]*">(.*?)</div>', client.get(location).content.decode(errors="replace"))
        words = "\n".join([location, *said])
    return response.status_code, normalized(words, pk)


def fingerprint() -> tuple:
    """Every table of the app counted (the API's audit trail aside) and every stage's status."""
    tables = [m._meta.db_table for m in apps.get_app_config("runs").get_models()
              if m._meta.label_lower != "runs.apiauditentry"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(f'(SELECT count(*) FROM "{t}")' for t in tables))
        counts = cursor.fetchone()
    return counts, [list(s.model.objects.order_by("pk").values_list("status", flat=True)) for s in STAGES]


def leaks(words: str) -> list[str]:
    return [secret for secret in SECRETS if secret in words]


ROLES = ("viewer", "launcher", "reviewer", "admin", "staff")
APP_ROUTES = [route for route in ROUTES if not route.startswith("admin/")]  # the admin site: staff only


def test_every_route_is_on_the_wall():
    missing = [route for route in APP_ROUTES if route not in WALL]
    assert missing == [], f"routes with no entry in tests/views/projects/matrix_projects.py: {missing}"
    assert [route for route in WALL if route not in ROUTES] == [], "entries for routes the URL map no longer has"


def test_every_probe_names_a_kind_and_action_of_the_table():
    probed = {(p.kind, p.action) for probes in WALL.values() for p in probes if p.kind}
    assert probed - set(access.ACTIONS) == set()
    assert set(access.ACTIONS) - probed == {("run", "name")}  # named in lists: every GET is read for leaks


@pytest.mark.parametrize("route", APP_ROUTES)
def test_route_answers_another_projects_object_as_one_that_does_not_exist(route, wall):
    failures = []
    for probe in WALL[route]:
        if resolve(probe.url.format(id=1, own_run=1).split("?")[0]).route != route:
            failures.append(f"{probe.url} does not resolve to {route}")
            continue
        for role in ROLES:
            if probe.kind is None:
                status, words = ask(wall, role, probe, MISSING)
                if role != "staff" and leaks(words):
                    failures.append(f"{probe.url} as {role} names {leaks(words)}")
                continue
            failures += wall_failures(wall, role, probe)
    assert failures == [], "\n".join(failures)


def wall_failures(wall: Wall, role: str, probe) -> list[str]:
    """One role's probe of an object: asked of an id that does not exist, of the other project's (before its
    own, whose writes would change what the pages around show) and of its own project's."""
    failures, asked = [], f"{probe.method} {probe.url} as {role}"
    answer = access.rule(role, probe.kind, probe.action)
    missing = ask(wall, role, probe, MISSING)
    if access.KINDS[probe.kind].run is not None:  # a project's (else the same to everyone signed in)
        before = fingerprint()
        other = ask(wall, role, probe, wall.other[probe.kind])
        if answer == access.EVERY_PROJECT and other == missing:
            failures.append(f"{asked}: another project's {probe.kind} is hidden from staff")
        if answer != access.EVERY_PROJECT:
            if other != missing:
                failures.append(f"{asked}: another project's {probe.kind} answers {other[0]}, one that does not "
                                f"exist {missing[0]}; words differ: {sorted(set(other[1].split()) ^ set(missing[1].split()))[:8]}")
            if leaks(other[1]):
                failures.append(f"{asked} names {leaks(other[1])}")
            if probe.method == "POST" and fingerprint() != before:
                failures.append(f"{asked}: another project's {probe.kind} changed the database")
    own = ask(wall, role, probe, wall.own[probe.kind])
    if role != "staff" and leaks(own[1] + missing[1]):
        failures.append(f"{asked} names {leaks(own[1] + missing[1])}")
    mine = answer == access.SEES or (answer == access.OWNER and role == "launcher")  # alpha's are his
    if mine and own == missing:
        failures.append(f"{asked}: its own project's {probe.kind} answers as one that does not exist ({own[0]})")
    return failures
