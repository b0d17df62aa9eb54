"""Writes for dataset curation: the sample catalogue, exclusion, tags; every change is logged."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet

from runs.models import CurationAction, Dataset, DatasetSample
from workers.stages.chats import read_conversations
from workers.stages.errors import InputError


# Conversations stored per INSERT while cataloguing; each batch commits, so a lost worker's retry
# continues after the samples already there.
CATALOGUE_BATCH = 2000


@dataclass(frozen=True)
class CatalogueCounts:
    added: int
    total: int


def _stored_batch(dataset: Dataset, batch: dict[str, DatasetSample]) -> None:
    """Add the batch's conversations the catalogue lacks. A unique (dataset, sample_id) keeps a pass
    that lost its lease and the pass that replaced it from storing one conversation twice."""
    known = set(dataset.samples.filter(sample_id__in=list(batch)).values_list("sample_id", flat=True))
    DatasetSample.objects.bulk_create([s for sid, s in batch.items() if sid not in known], ignore_conflicts=True)


def dataset_samples_sync(*, dataset: Dataset, on_progress: Callable[[int, int], None] | None = None
                         ) -> CatalogueCounts:
    """Catalogue every conversation of the file; a malformed line raises naming file and line.

    Two passes: the file is checked first, so a bad line anywhere stores nothing; then the
    conversations not yet known are added in batches, up to where the check read (lines appended
    meanwhile wait for the next pass, which registering the grown file asks for). Existing samples
    keep their curation (excluded, tags, notes). `on_progress(done, total)` counts bytes over both
    passes; memory stays one batch, whatever the dataset's size."""
    path = Path(dataset.path)
    total = 2 * max(1, path.stat().st_size)
    report = on_progress or (lambda done, total: None)
    checked = [0]

    def first_pass(pos: int) -> None:
        checked[0] = pos
        report(min(pos, total // 2), total)

    for _ in read_conversations(path, on_position=first_pass):
        pass
    before = dataset.samples.count()
    reached = [0]

    def second_pass(pos: int) -> None:
        reached[0] = pos
        report(min(total // 2 + pos, total), total)

    batch: dict[str, DatasetSample] = {}
    for conv in read_conversations(path, on_position=second_pass):
        if reached[0] > checked[0]:
            break  # past what the first pass checked: the file grew since
        if conv.source_id in batch:
            continue
        first_user = next((m["content"] for m in conv.messages if m["role"] == "user"), "")
        batch[conv.source_id] = DatasetSample(
            dataset=dataset, sample_id=conv.source_id, line=conv.line,
            num_turns=sum(1 for m in conv.messages if m["role"] == "assistant"),
            num_chars=sum(len(m["content"]) for m in conv.messages), preview=first_user[:300],
        )
        if len(batch) >= CATALOGUE_BATCH:
            _stored_batch(dataset, batch)
            batch = {}
    _stored_batch(dataset, batch)
    report(total, total)
    after = dataset.samples.count()
    return CatalogueCounts(added=after - before, total=after)


@transaction.atomic
def samples_set_excluded(*, samples: QuerySet[DatasetSample], excluded: bool, user: AbstractBaseUser) -> int:
    by_dataset: dict[int, list[str]] = {}
    for dataset_id, sample_id in samples.values_list("dataset_id", "sample_id"):
        by_dataset.setdefault(dataset_id, []).append(sample_id)
    count = samples.update(excluded=excluded)
    for dataset_id, ids in by_dataset.items():
        CurationAction.objects.create(user=user, dataset_id=dataset_id, action="exclude" if excluded else "include",
                                      sample_ids=ids, detail=f"{len(ids)} sample(s)")
    return count


@transaction.atomic
def samples_tag(*, samples: QuerySet[DatasetSample], tag: str, user: AbstractBaseUser) -> int:
    tag = tag.strip().replace(",", " ")
    if not tag:
        raise InputError("the tag is empty")
    by_dataset: dict[int, list[str]] = {}
    for sample in samples:
        tags = [t for t in sample.tags.split(",") if t]
        if tag not in tags:
            sample.tags = ",".join([*tags, tag])
            sample.save(update_fields=["tags"])
        by_dataset.setdefault(sample.dataset_id, []).append(sample.sample_id)
    for dataset_id, ids in by_dataset.items():
        CurationAction.objects.create(user=user, dataset_id=dataset_id, action="tag", sample_ids=ids,
                                      detail=f"tag {tag!r} on {len(ids)} sample(s)")
    return sum(len(ids) for ids in by_dataset.values())


def dataset_excluded_ids(*, dataset: Dataset) -> frozenset[str]:
    return frozenset(dataset.samples.filter(excluded=True).values_list("sample_id", flat=True))
