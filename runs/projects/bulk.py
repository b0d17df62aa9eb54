"""Acting on many runs at once from the runs list: tag them, archive them, bring them back; and from a
project's page, moving runs into it.

Each run must be one the user may change: its project's owners may change all of its runs, its editors
those they may act on by the site's rule (their own, or as an admin or an allowed teammate:
runs.roles.may_act_on_run). One run that is not refuses the whole action and changes nothing; a run the
user does not see is named as if it did not exist."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import F

from runs.pipeline.models import PipelineRun
from runs.pipeline.status.changes import runs_list_changed
from runs.projects.models import Project, ProjectMember
from runs.review.models import RunTag
from runs.projects import access
from runs.roles import may_act_on_run
from runs.review.tags import MAX_TAGS_PER_RUN, TagError, parse_tags
from workers.contract.errors import InputError

MAX_BULK_RUNS = 500  # a page of the list is 50; "select all matching" is not offered


class BulkError(InputError):
    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


def bulk_ids(values: list[str]) -> list[int]:
    """Run ids from the form's or the body's `ids` (each once, in order); BulkError naming `ids`."""
    ids: list[int] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            if len(part) > 18 or not (part.isascii() and part.isdigit()):
                raise BulkError(f"ids: {part[:30]!r} is not a run id", field="ids")
            if int(part) not in ids:
                ids.append(int(part))
    if not ids:
        raise BulkError("ids: tick at least one run", field="ids")
    if len(ids) > MAX_BULK_RUNS:
        raise BulkError(f"ids: {len(ids)} runs; at most {MAX_BULK_RUNS} at once", field="ids")
    return ids


def _editable(*, user: AbstractBaseUser, run_ids: list[int]) -> list[PipelineRun]:
    runs = {run.pk: run for run in access.runs_visible(PipelineRun.objects.filter(pk__in=run_ids), user)
            .select_related("project", "owner").select_for_update(of=("self",))}
    missing = [pk for pk in run_ids if pk not in runs]
    if missing:
        raise BulkError(f"ids: no run {', '.join(str(pk) for pk in missing[:10])}", field="ids")
    roles = access.project_roles(user)
    for run in runs.values():
        rank = access.RANK.get(roles.get(run.project_id), 0)
        if rank >= access.RANK[ProjectMember.Role.OWNER]:
            continue
        if rank < access.RANK[ProjectMember.Role.EDITOR]:
            raise PermissionDenied(f"{user.get_username()} may not change run {run.pk}: it is in project "
                                   f"{run.project.name}, where you are not an editor")
        if not may_act_on_run(user, run):
            raise PermissionDenied(f"{user.get_username()} may not change run {run.pk}: it is "
                                   f"{run.owner.get_username()}'s, and in project {run.project.name} only its owner, "
                                   "admins and the project's owners may")
    return [runs[pk] for pk in run_ids]


@transaction.atomic
def runs_tag_add(*, user: AbstractBaseUser, run_ids: list[int], text: str) -> list[str]:
    """Add the typed tags to every run (their other tags stay); the tag names added."""
    try:
        names = parse_tags(text)
    except TagError as exc:
        raise BulkError(str(exc), field="tags") from None
    if not names:
        raise BulkError("tags: type at least one tag", field="tags")
    runs = _editable(user=user, run_ids=run_ids)
    tags = [RunTag.objects.get_or_create(name=name)[0] for name in names]
    links = RunTag.runs.through
    have = {}
    for run_id, tag_id in links.objects.filter(pipelinerun_id__in=run_ids).values_list("pipelinerun_id", "runtag_id"):
        have.setdefault(run_id, set()).add(tag_id)
    for run in runs:
        if len(have.get(run.pk, set()) | {t.pk for t in tags}) > MAX_TAGS_PER_RUN:
            raise BulkError(f"tags: run {run.pk} would carry more than {MAX_TAGS_PER_RUN} tags", field="tags")
    links.objects.bulk_create([links(pipelinerun_id=run.pk, runtag_id=tag.pk) for run in runs for tag in tags
                               if tag.pk not in have.get(run.pk, set())])
    return names


@transaction.atomic
def runs_archive(*, user: AbstractBaseUser, run_ids: list[int], archived: bool = True) -> int:
    """Archive the runs (hidden from the list unless asked for) or bring them back; how many changed.
    Their state counter moves, so the cached runs list is built again (runs.pipeline.status.changes)."""
    _editable(user=user, run_ids=run_ids)
    runs_list_changed()
    return (PipelineRun.objects.filter(pk__in=run_ids).exclude(archived=archived)
            .update(archived=archived, state_changes=F("state_changes") + 1))


@transaction.atomic
def runs_move(*, user: AbstractBaseUser, run_ids: list[int], project: Project) -> int:
    """Move the runs into `project`: the user must own it (or be staff) and may change each run where it is
    now (as tagging asks); its members then see them, those of the run's old project no longer. How many
    moved (those already there stay). Their state counter moves, so cached lists are built again."""
    if not access.sees_every_project(user):
        access.require_role(user, project, ProjectMember.Role.OWNER, "move runs")
    _editable(user=user, run_ids=run_ids)
    runs_list_changed()
    return (PipelineRun.objects.filter(pk__in=run_ids).exclude(project=project)
            .update(project=project, state_changes=F("state_changes") + 1))
