"""The runs list's one statement of its viewer's reads (runs/saved_views/viewer_reads.py, issue 40) answers what
each rule answers on its own: the projects of runs.projects.access.visible_projects, the saved views of
runs.saved_views.selectors.saved_views_for (a shared view of a project one does not see stays unseen), the bell's
unread count and the list's version, for a member, an outsider, staff and a superuser, in one query."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.alerts.models import Alert, AlertNotice, AlertRule
from runs.alerts.selectors import unread_count
from runs.pipeline.status import changes
from runs.projects import access
from runs.projects.services import project_create, project_member_set
from runs.saved_views.models import SavedView
from runs.saved_views.selectors import saved_views_for
from runs.saved_views.viewer_reads import viewer_reads

pytestmark = pytest.mark.django_db


def _person(name, *groups, **flags):
    account = get_user_model().objects.create_user(name, password=f"pw-{name}-1", **flags)
    for group in groups:
        account.groups.add(Group.objects.get_or_create(name=group)[0])
    return account


def test_one_statement_reads_what_each_rule_reads(user):
    owner = _person("olga", "launcher")
    secret = project_create(user=owner, name="secret")
    other = project_create(user=owner, name="other")
    member = _person("mia")
    project_member_set(project=secret, user=owner, username="mia", role="viewer")
    outsider = _person("otto")
    staff = _person("sam", is_staff=True)
    root = get_user_model().objects.create_superuser("rose", password="pw-rose-1")
    SavedView.objects.create(owner=owner, name="secret's", params={"project": "secret"}, project=secret, shared=True)
    SavedView.objects.create(owner=owner, name="other's", params={"sort": "-tau"}, project=other, shared=True)
    SavedView.objects.create(owner=member, name="mine", params={"q": "x", "sort": "name"})
    SavedView.objects.create(owner=staff, name="staff's", params={"tau_min": "2"})
    rule = AlertRule.objects.create(owner=owner, event=AlertRule._meta.get_field("event").choices[0][0])
    for i in range(3):
        alert = Alert.objects.create(rule=rule, subject=f"s{i}", event=rule.event, text="t")
        AlertNotice.objects.create(alert=alert, user=member, read_at=alert.created_at if i == 0 else None)
    seen = {}
    for person in (member, outsider, staff, root, owner):
        with CaptureQueriesContext(connection) as queries:
            reads = viewer_reads(person)
        assert len(queries) == 1
        visible, names = access.visible_projects(person)
        views = list(saved_views_for(user=person, visible=visible))
        assert (reads.visible, reads.project_names) == (visible, names)
        assert [(v.pk, v.name, v.params, v.shared, v.owner_id, v.owner.get_username(), v.project_id,
                 v.project.name if v.project else None) for v in reads.views] == [
            (v.pk, v.name, v.params, v.shared, v.owner_id, v.owner.get_username(), v.project_id,
             v.project.name if v.project else None) for v in views]
        assert reads.counts == {"alerts_unread": unread_count(user=person)}
        assert reads.version == changes.runs_list_version()
        seen[person.username] = [v.name for v in reads.views]
    assert seen["mia"] == ["mine", "secret's"] and seen["otto"] == []
    assert seen["sam"] == ["other's", "secret's", "staff's"]
    assert viewer_reads(member).counts == {"alerts_unread": 2}
