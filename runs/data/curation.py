"""Writes for dataset curation: the sample catalogue, exclusion, tags; every change is logged."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q, QuerySet

from eagle3web.db import db_retry
from runs.data.models import CurationAction, Dataset, DatasetSample
from workers.contract.chats.jsonl import read_conversations
from workers.contract.errors import InputError


# Conversations stored per INSERT while cataloguing; each batch commits, so a lost worker's retry
# continues after the samples already there.
CATALOGUE_BATCH = 2000
CONTENT_FIELDS = ("line", "num_turns", "num_chars", "preview", "content_hash")
CURATION_FIELDS = ("excluded", "tags", "notes")
# How many sample ids a curation log entry (and the admin's message) names before counting the rest,
# and how much of each id it shows: the entry's detail holds 500 characters; sample_ids keeps them all.
NAMED_SAMPLES = 10
NAMED_ID_CHARS = 32


@dataclass(frozen=True)
class CatalogueCounts:
    added: int
    total: int


@dataclass(frozen=True)
class _Curation:
    """What curators set on one conversation, and the id that held it before this pass."""
    excluded: bool
    tags: str
    notes: str
    held_by: str

    def __str__(self) -> str:
        parts = ["excluded"] if self.excluded else []
        parts += [f"tags {self.tags!r}"] if self.tags else []
        parts += ["notes"] if self.notes else []
        return ", ".join(parts)


def _curation_of(sample: DatasetSample) -> _Curation | None:
    if sample.excluded or sample.tags or sample.notes:
        return _Curation(sample.excluded, sample.tags, sample.notes, sample.sample_id)
    return None


def _curated_content(dataset: Dataset) -> dict[str, _Curation]:
    """Content hash -> its curation, read before a pass rewrites any sample. Only excluded, tagged
    or annotated samples (few), so memory does not grow with the dataset."""
    out: dict[str, _Curation] = {}
    rows = dataset.samples.exclude(content_hash="").filter(Q(excluded=True) | ~Q(tags="") | ~Q(notes=""))
    for sample in rows.order_by("line").only("sample_id", "content_hash", *CURATION_FIELDS).iterator():
        seen, mine = out.get(sample.content_hash), _curation_of(sample)
        if seen is not None:  # the same conversation under several ids: keep every mark any of them had
            tags = ",".join(dict.fromkeys(t for t in f"{seen.tags},{mine.tags}".split(",") if t))
            mine = _Curation(seen.excluded or mine.excluded, tags, seen.notes or mine.notes, seen.held_by)
        out[sample.content_hash] = mine
    return out


def _with_content(sample: DatasetSample, fresh: DatasetSample) -> bool:
    """Copy what the file now holds under the sample's id; whether anything changed."""
    changed = any(getattr(sample, f) != getattr(fresh, f) for f in CONTENT_FIELDS)
    for field in CONTENT_FIELDS:
        setattr(sample, field, getattr(fresh, field))
    return changed


def _moved(*, dataset: Dataset, sample: DatasetSample, curation: _Curation) -> CurationAction:
    """Give the sample the curation of the conversation it now holds, logged as a rekey."""
    sample.excluded, sample.tags, sample.notes = curation.excluded, curation.tags, curation.notes
    return CurationAction(dataset=dataset, action="rekey", sample_ids=[curation.held_by, sample.sample_id],
                          detail=f"{curation} followed its conversation from id {curation.held_by} to id "
                                 f"{sample.sample_id} (line {sample.line})"[:500])


@transaction.atomic
def _stored_batch(*, dataset: Dataset, batch: dict[str, DatasetSample], by_line: set[str],
                  curated: dict[str, _Curation]) -> list[tuple[int, DatasetSample]]:
    """Add the batch's conversations the catalogue lacks and bring known ids up to the file.

    A row keyed by its line (`by_line`) whose id now holds another conversation takes the curation
    of the conversation it holds now (`curated`); if it had curation of its own, it is returned, to
    wait for `_rekeyed` after the pass, so a pass stopped between batches has not yet lost that
    curation (returned, not appended to a list of the caller's: a batch tried again after a locked
    or lost database must not defer a row twice). A row's own "id" stays its key: its curation
    stays. A unique (dataset, sample_id) keeps a pass that lost its lease and the pass that
    replaced it from storing one conversation twice."""
    # Locked: curation is written back below, so a curator's change meanwhile waits rather than being lost.
    known = {s.sample_id: s for s in dataset.samples.select_for_update().filter(sample_id__in=list(batch))
             .only("sample_id", *CONTENT_FIELDS, *CURATION_FIELDS)}
    new, changed, actions, deferred = [], [], [], []
    for sid, fresh in batch.items():
        sample = known.get(sid)
        gained = curated.get(fresh.content_hash) if sid in by_line else None
        if sample is None:
            if gained is not None:
                actions.append(_moved(dataset=dataset, sample=fresh, curation=gained))
            new.append(fresh)
        elif sample.content_hash in ("", fresh.content_hash) or sid not in by_line:
            # The hash is new (an older catalogue) or the same, or the row has its own id: curation
            # stays on the id; the catalogue shows what the file holds there now.
            if _with_content(sample, fresh):
                changed.append(sample)
        elif _curation_of(sample) is not None:
            deferred.append((sample.pk, fresh))
        else:
            _with_content(sample, fresh)
            if gained is not None:
                actions.append(_moved(dataset=dataset, sample=sample, curation=gained))
            changed.append(sample)
    DatasetSample.objects.bulk_create(new, ignore_conflicts=True)
    DatasetSample.objects.bulk_update(changed, [*CONTENT_FIELDS, *CURATION_FIELDS])
    CurationAction.objects.bulk_create(actions)
    return deferred


@transaction.atomic
def _rekeyed(*, dataset: Dataset, deferred: list[tuple[int, DatasetSample]], curated: dict[str, _Curation]) -> None:
    """Ids keyed by line whose curated conversation moved elsewhere: they show what they hold now,
    with that conversation's curation or none; each clear and move is logged."""
    fresh_by_pk = dict(deferred)
    for sample in DatasetSample.objects.select_for_update().filter(pk__in=list(fresh_by_pk)):
        fresh, before = fresh_by_pk[sample.pk], _curation_of(sample)
        if sample.content_hash == fresh.content_hash:
            continue  # another pass got here first
        _with_content(sample, fresh)
        sample.excluded, sample.tags, sample.notes = False, "", ""
        if before is not None:  # None: a curator cleared it since the pass began
            CurationAction.objects.create(
                dataset=dataset, action="rekey", sample_ids=[sample.sample_id],
                detail=f"id {sample.sample_id} now holds another conversation (line {sample.line}); its {before} "
                       "cleared here, they follow the conversation they were set on"[:500])
        gained = curated.get(fresh.content_hash)
        if gained is not None:
            _moved(dataset=dataset, sample=sample, curation=gained).save()
        sample.save(update_fields=[*CONTENT_FIELDS, *CURATION_FIELDS])


def dataset_samples_sync(*, dataset: Dataset, on_progress: Callable[[int, int], None] | None = None
                         ) -> CatalogueCounts:
    """Catalogue every conversation of the file; a malformed line raises naming file and line.

    Two passes: the file is checked first, so a bad line anywhere stores nothing; then the
    conversations not yet known are added in batches, up to where the check read (lines appended
    meanwhile wait for the next pass, which registering the grown file asks for). Curation
    (excluded, tags, notes) stays with the conversation: with the id for rows carrying one, with the
    content for rows keyed by their line (see `_stored_batch`). `on_progress(done, total)` counts
    bytes over both passes; memory stays one batch plus the curated samples' hashes."""
    path = Path(dataset.path)
    total = 2 * max(1, path.stat().st_size)
    report = on_progress or (lambda done, total: None)
    checked = [0]

    def first_pass(pos: int) -> None:
        checked[0] = pos
        report(min(pos, total // 2), total)

    for _ in read_conversations(path, on_position=first_pass):
        pass
    # Each read and batch rides out a locked (SQLite) or lost database: a million-row pass takes
    # minutes, beside workers and web requests that write too.
    before = db_retry("catalogue count", dataset.samples.count)
    curated = db_retry("catalogue curation", _curated_content, dataset=dataset)
    deferred: list[tuple[int, DatasetSample]] = []
    reached = [0]

    def second_pass(pos: int) -> None:
        reached[0] = pos
        report(min(total // 2 + pos, total), total)

    batch: dict[str, DatasetSample] = {}
    by_line: set[str] = set()
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
            content_hash=conv.content_hash,
        )
        if conv.keyed_by_line:
            by_line.add(conv.source_id)
        if len(batch) >= CATALOGUE_BATCH:
            deferred += db_retry("catalogue batch", _stored_batch, dataset=dataset, batch=batch, by_line=by_line,
                                 curated=curated)
            batch, by_line = {}, set()
    deferred += db_retry("catalogue batch", _stored_batch, dataset=dataset, batch=batch, by_line=by_line,
                         curated=curated)
    db_retry("catalogue rekey", _rekeyed, dataset=dataset, deferred=deferred, curated=curated)
    report(total, total)
    after = db_retry("catalogue count", dataset.samples.count)
    return CatalogueCounts(added=after - before, total=after)


def samples_named(ids: list[str], *, total: int | None = None) -> str:
    """"a, b, c" or "a, b, ... and 7 more": the first NAMED_SAMPLES ids (each cut to NAMED_ID_CHARS),
    then how many more of `total` (default: len(ids)) there are."""
    total = len(ids) if total is None else total
    shown = [i if len(i) <= NAMED_ID_CHARS else i[:NAMED_ID_CHARS - 1] + "\u2026" for i in ids[:NAMED_SAMPLES]]
    rest = total - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest > 0 else "")


@transaction.atomic
def samples_set_excluded(*, samples: QuerySet[DatasetSample], excluded: bool, user: AbstractBaseUser) -> int:
    by_dataset: dict[int, list[str]] = {}
    for dataset_id, sample_id in samples.values_list("dataset_id", "sample_id"):
        by_dataset.setdefault(dataset_id, []).append(sample_id)
    count = samples.update(excluded=excluded)
    for dataset_id, ids in by_dataset.items():
        CurationAction.objects.create(user=user, dataset_id=dataset_id, action="exclude" if excluded else "include",
                                      sample_ids=ids, detail=f"{len(ids)} sample(s): {samples_named(ids)}"[:500])
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
                                      detail=f"tag {tag!r} on {len(ids)} sample(s): {samples_named(ids)}"[:500])
    return sum(len(ids) for ids in by_dataset.values())


@dataclass(frozen=True)
class Exclusions:
    """What a preparation skips (workers.stages.prepare.stage's exclude_* arguments)."""
    ids: frozenset[str]  # excluded samples without a content hash yet: matched by id, as before
    hashes: frozenset[str]  # excluded conversations, matched by content in rows without an "id"
    own_ids: frozenset[str]  # ids of the excluded samples with a hash, matched in rows carrying that "id"


def dataset_exclusions(*, dataset: Dataset) -> Exclusions:
    ids, hashes, own_ids = set(), set(), set()
    for sample_id, content_hash in dataset.samples.filter(excluded=True).values_list("sample_id", "content_hash"):
        if content_hash:
            hashes.add(content_hash)
            own_ids.add(sample_id)
        else:
            ids.add(sample_id)
    return Exclusions(ids=frozenset(ids), hashes=frozenset(hashes), own_ids=frozenset(own_ids))
