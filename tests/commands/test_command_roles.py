"""Every management command of the app against every role: a command that writes on a user's behalf
takes --user and refuses, with a CommandError naming the role to ask for, a user whose role may not;
the others are an operator's (a shell on the server) and take no user.

The commands are read from Django's command registry, so a new one without an entry here fails."""
from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command, get_commands, load_command_class

from runs.pipeline import services
from runs.data.extractions import extraction_import
from runs.models import (Checkpoint, Dataset, DatasetRegeneration, Evaluation, Extraction, PipelineRun, Sweep,
                         Verification)
from runs.pipeline.launch.run_config import RunConfig

pytestmark = pytest.mark.django_db

ROLES = ("viewer", "launcher", "reviewer", "admin")
ALLOWED, REFUSED = "allowed", "refused"

# command -> (expected outcome per role, name of the Setup method giving its arguments)
ACTING = {
    "run_pipeline": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": REFUSED, "admin": ALLOWED}, "launch"),
    "import_extraction": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": REFUSED, "admin": ALLOWED},
                          "import_extraction"),
    "import_checkpoint": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": REFUSED, "admin": ALLOWED},
                          "import_checkpoint"),
    "verify_extraction": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": ALLOWED, "admin": ALLOWED},
                          "verify"),
    "evaluate_checkpoint": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": REFUSED, "admin": ALLOWED},
                            "evaluate"),
    "serve_check": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": REFUSED, "admin": ALLOWED}, "evaluate"),
    "launch_sweep": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": REFUSED, "admin": ALLOWED}, "sweep"),
    "regenerate_dataset": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": REFUSED, "admin": ALLOWED},
                           "regenerate"),
    "export_checkpoint": ({"viewer": REFUSED, "launcher": ALLOWED, "reviewer": REFUSED, "admin": ALLOWED}, "export"),
}
# An operator's commands: whoever has a shell on the server runs them; they act for nobody.
# create_api_token makes a token for the user it names (an operator's act, like createsuperuser).
OPERATOR = {"reconcile_stages", "build_demo_assets", "demo_login", "create_api_token"}


class Setup:
    def __init__(self, data_root, config_only_target):
        self.root, self.target = data_root, config_only_target
        users = get_user_model()
        self.users = {}
        for role in ROLES:
            account = users.objects.create_user(f"cmd-{role}", is_superuser=role == "admin",
                                                is_staff=role == "admin")
            account.groups.add(Group.objects.get_or_create(name=role)[0])
            self.users[role] = account
        self.dataset = data_root / "cmd-chats.jsonl"
        self.dataset.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"},
                                                              {"from": "gpt", "value": "hello"}]}) + "\n")
        from tests.contract.test_verify import write_flat

        self.extraction, _ = extraction_import(path=write_flat(data_root / "cmd-ext"), target_path=self.target)
        run = services.run_launch(user=self.users["admin"], target_path=self.target, dataset_path=self.dataset,
                                  config=RunConfig(draft_vocab_size=64), enqueue=False)
        self.checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0,
                                                    path=str(data_root / "cmd-ckpt"))
        self.n = 0

    def launch(self) -> list[str]:
        return ["--target", str(self.target), "--dataset", str(self.dataset), "--draft-vocab-size", "64", "--json"]

    def sweep(self) -> list[str]:
        return [*self.launch(), "--vary", "lr=1e-4,3e-4"]

    def regenerate(self) -> list[str]:
        # Queued, not run: no worker takes the job in this test.
        return ["--target", str(self.target), "--dataset", str(self.dataset), "--backend", "transformers", "--json"]

    def import_extraction(self) -> list[str]:
        from tests.contract.test_verify import write_flat

        self.n += 1
        return [str(write_flat(self.root / f"cmd-import-{self.n}")), "--target", str(self.target), "--json"]

    def import_checkpoint(self) -> list[str]:
        # Past the role check it fails on the directory: proof enough that the role let it through.
        return [str(self.root / "no-such-checkpoint"), "--json"]

    def verify(self) -> list[str]:
        return [str(self.extraction.pk), "--json"]

    def export(self) -> list[str]:
        # Past the role check it fails on the checkpoint's folder, which this test never writes: nothing exported.
        self.n += 1
        return [str(self.checkpoint.pk), str(self.root / f"cmd-export-{self.n}"), "--json"]

    def evaluate(self) -> list[str]:
        # Refused for its value, after the role check: no decoding runs in this test.
        return [str(self.checkpoint.pk), "--max-new-tokens", "0", "--json"]


def stored() -> tuple:
    return (PipelineRun.objects.count(), Extraction.objects.count(), Checkpoint.objects.count(),
            Verification.objects.count(), Evaluation.objects.count(), Dataset.objects.count(),
            DatasetRegeneration.objects.count(), Sweep.objects.count())


@pytest.fixture
def setup(tmp_path, config_only_target):
    return Setup(tmp_path, config_only_target)  # tmp_path lies under the data roots


def app_commands() -> list[str]:
    return sorted(name for name, app in get_commands().items() if app == "runs")


def test_every_command_of_the_app_has_an_entry():
    assert sorted(set(app_commands()) - set(ACTING) - OPERATOR) == []
    assert sorted((set(ACTING) | OPERATOR) - set(app_commands())) == []


@pytest.mark.parametrize("name", sorted(OPERATOR))
def test_an_operator_command_acts_for_nobody(name):
    parser = load_command_class("runs", name).create_parser("manage.py", name)
    assert "--user" not in parser._option_string_actions


@pytest.mark.parametrize("name", sorted(ACTING))
def test_a_command_acting_for_a_user_refuses_roles_that_may_not(name, setup):
    expected, args = ACTING[name]
    failures = []
    for role in ROLES:
        before = stored()
        try:
            call_command(name, *getattr(setup, args)(), "--user", setup.users[role].username, stdout=io.StringIO())
            error = None
        except CommandError as exc:
            error = str(exc)
        refused = error is not None and "may not" in error
        if expected[role] == REFUSED:
            if not refused:
                failures.append(f"{name} --user {role}: expected a refusal, got {error or 'success'}")
            elif "ask an admin for the" not in error:
                failures.append(f"{name} --user {role}: the refusal does not say which role to ask for: {error}")
            if stored() != before:
                failures.append(f"{name} --user {role} was refused but stored rows")
        elif refused:
            failures.append(f"{name} --user {role}: refused although the role may: {error}")
    assert failures == [], "\n".join(failures)


@pytest.mark.parametrize("name", sorted(ACTING))
def test_an_unknown_or_deactivated_user_is_refused(name, setup):
    args = getattr(setup, ACTING[name][1])()
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command(name, *args, "--user", "nobody", stdout=io.StringIO())
    launcher = setup.users["launcher"]
    launcher.is_active = False
    launcher.save()
    before = stored()
    with pytest.raises(CommandError, match="cmd-launcher is deactivated"):
        call_command(name, *args, "--user", launcher.username, stdout=io.StringIO())
    assert stored() == before


def test_without_user_a_command_acts_as_the_cli_launcher(setup):
    out = io.StringIO()
    call_command("run_pipeline", *setup.launch(), stdout=out)
    run = PipelineRun.objects.get(pk=json.loads(out.getvalue())["run_id"])
    assert run.owner.username == "cli"
    assert list(run.owner.groups.values_list("name", flat=True)) == ["launcher"]
