"""Reads of alerts: a user's rules and notices, the rules that watch a run's owner, who hears a rule."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q, QuerySet

from runs.alerts.models import AlertNotice, AlertRule
from runs.roles import ROLES

NOTICES_SHOWN = 200  # the list page shows the newest; older ones stay in the database


def rule_list(*, user) -> QuerySet[AlertRule]:
    """The user's rules, each with `baseline_seen`: whether they still see its baseline run (staff may move a
    run to another project); the page names only a baseline they see (runs.projects.access)."""
    from runs.pipeline.models import PipelineRun
    from runs.projects import access

    seen = access.visible("run", PipelineRun.objects.filter(pk=OuterRef("baseline_run_id")), user)
    return AlertRule.objects.filter(owner=user).select_related("team", "baseline_run").annotate(baseline_seen=Exists(seen))


def rule_of_user(*, user, rule_id: int) -> AlertRule | None:
    """The user's rule (an admin may reach anyone's), or None."""
    rules = AlertRule.objects.all() if user.is_superuser else AlertRule.objects.filter(owner=user)
    return rules.filter(pk=rule_id).first()


def user_teams(*, user) -> list[tuple[str, str]]:
    """(value, label) of the teams a user may set a rule for: staff (a staff user), and their groups that
    are not roles."""
    teams = [("staff", "all staff")] if user.is_staff else []
    groups = user.groups.exclude(name__in=ROLES).order_by("name").values_list("name", flat=True)
    return teams + [(name, f"team {name}") for name in groups]


def rules_watching(*, event: str, owner_id: int) -> list[AlertRule]:
    """The rules for `event` that watch the runs of user `owner_id`: theirs without a team, every rule of a
    team they are in, and the staff rules when they are staff."""
    owner = get_user_model().objects.filter(pk=owner_id).first()
    if owner is None:
        return []
    watching = Q(owner_id=owner_id, team__isnull=True, staff=False) | Q(team__in=owner.groups.all())
    if owner.is_staff:
        watching |= Q(staff=True)
    return list(AlertRule.objects.filter(watching, event=event).select_related("owner", "team", "baseline_run")
                .distinct())


def rule_recipients(*, rule: AlertRule) -> list:
    """Who hears a rule: its owner, and with a team every active member."""
    users = get_user_model().objects.filter(is_active=True)
    if rule.staff:
        members = users.filter(is_staff=True)
    elif rule.team_id:
        members = users.filter(groups=rule.team_id)
    else:
        members = users.none()
    return list(users.filter(Q(pk=rule.owner_id) | Q(pk__in=members.values("pk"))).order_by("pk"))


def notice_list(*, user) -> QuerySet[AlertNotice]:
    return (AlertNotice.objects.filter(user=user).select_related("alert", "alert__run", "alert__rule")
            .prefetch_related("alert__deliveries")[:NOTICES_SHOWN])


def unread_count(*, user) -> int:
    return unread_notices(user).count()


def unread_notices(user) -> QuerySet[AlertNotice]:
    """The user's (or the user id's) notices not yet read: the bell's count (runs.alerts.context; the runs list
    counts them in its own statement, runs.saved_views.viewer_reads)."""
    return AlertNotice.objects.filter(user=user, read_at__isnull=True)


def notice_exists(*, user, notice_id: int) -> bool:
    return AlertNotice.objects.filter(user=user, pk=notice_id).exists()
