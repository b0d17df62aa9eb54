"""Writes for dataset curation: the sample catalogue, exclusion, tags; every change is logged."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet

from runs.models import CurationAction, Dataset, DatasetSample
from workers.stages.chats import read_conversations
from workers.stages.errors import InputError


@transaction.atomic
def dataset_samples_sync(*, dataset: Dataset) -> int:
    """Catalogue every conversation of the file; a malformed line raises naming file and line.

    Existing samples keep their curation (excluded, tags, notes); new ones are added.
    """
    known = set(dataset.samples.values_list("sample_id", flat=True))
    new = []
    for conv in read_conversations(dataset.path):
        if conv.source_id in known:
            continue
        first_user = next((m["content"] for m in conv.messages if m["role"] == "user"), "")
        new.append(DatasetSample(
            dataset=dataset, sample_id=conv.source_id, line=conv.line,
            num_turns=sum(1 for m in conv.messages if m["role"] == "assistant"),
            num_chars=sum(len(m["content"]) for m in conv.messages), preview=first_user[:300],
        ))
        known.add(conv.source_id)
    DatasetSample.objects.bulk_create(new, batch_size=2000)
    return len(new)


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
