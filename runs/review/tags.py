"""Tags on runs: set by people who may launch, shown and filtered on the runs list."""
from __future__ import annotations

import unicodedata

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from runs.pipeline.models import PipelineRun
from runs.review.models import RunTag
from runs.roles import require_on_run
from runs.review.models import MAX_TAG_CHARS
from workers.contract.errors import InputError

MAX_TAGS_PER_RUN = 20


class TagError(InputError):
    pass


def parse_tags(text: str) -> list[str]:
    """Comma-separated tags, each once, in the order typed."""
    if len(text) > MAX_TAGS_PER_RUN * (MAX_TAG_CHARS + 2):
        raise TagError(f"tags: {len(text)} characters; at most {MAX_TAGS_PER_RUN} tags of {MAX_TAG_CHARS}")
    names: list[str] = []
    for raw in text.split(","):
        name = " ".join(raw.split())
        if not name:
            continue
        if len(name) > MAX_TAG_CHARS:
            raise TagError(f"tag {name[:50]!r} is {len(name)} characters long; at most {MAX_TAG_CHARS}")
        if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in name):
            raise TagError(f"tag {name[:50]!r} holds control or unassigned characters")
        if name not in names:
            names.append(name)
    if len(names) > MAX_TAGS_PER_RUN:
        raise TagError(f"{len(names)} tags; a run takes at most {MAX_TAGS_PER_RUN}")
    return names


@transaction.atomic
def run_tags_set(*, run: PipelineRun, text: str, user: AbstractBaseUser) -> list[str]:
    """Replace the run's tags with those typed; tags no run uses any more are kept for the menus' sake
    only while a run has them."""
    require_on_run(user, run, "tag")
    names = parse_tags(text)
    tags = [RunTag.objects.get_or_create(name=name)[0] for name in names]
    run.tags.set(tags)
    RunTag.objects.filter(runs__isnull=True).delete()
    return names
