"""Curation follows a conversation's content, not its line. A chat file without "id"s keys each row
by its line index, so a line inserted above an excluded conversation must neither make later
preparations skip its neighbour nor leave the exclusion on the id that now holds the neighbour."""
import json

import pytest

from runs.pipeline.jobs import services as job_services
from runs.pipeline import services
from runs.data.curation import dataset_exclusions
from runs.models import CurationAction, Dataset, DatasetSample, Preparation
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.chats.jsonl import content_hash
from workers.orchestration.tasks import stage_execute

pytestmark = pytest.mark.django_db


def chat(i, **extra) -> dict:
    return {**extra, "messages": [{"role": "user", "content": f"question {i}"},
                                  {"role": "assistant", "content": f"the answer to question {i} is {i}"}]}


def write(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def catalogued(path, django_capture_on_commit_callbacks) -> Dataset:
    """Register the file (again) and ask for a pass, then run it the way a worker does."""
    with django_capture_on_commit_callbacks(execute=False):
        dataset = services.dataset_register(path=path)
        job_services.dataset_catalogue_request(dataset=dataset)  # the one registering queued, if it did
    assert stage_execute(stage_name="catalogue", record_id=dataset.catalogues.get(status="queued").pk, worker="t")
    return dataset


def prepared_ids(tiny_target, user, path, django_capture_on_commit_callbacks) -> tuple[list[str], Preparation]:
    """Launch a run on the file and prepare it (a new catalogue pass is queued, never run here)."""
    from datasets import load_from_disk

    with django_capture_on_commit_callbacks(execute=False):
        run = services.run_launch(user=user, target_path=tiny_target.target_dir, dataset_path=path,
                                  config=RunConfig(max_seq_len=256))
    assert stage_execute(stage_name="prepare", record_id=run.preparation.pk, worker="t")
    preparation = Preparation.objects.get(run=run)
    ids = load_from_disk(preparation.out_dir).with_format(None)["source_id"]
    return list(dict.fromkeys(ids)), preparation


def sample(dataset: Dataset, sample_id: str) -> DatasetSample:
    return dataset.samples.get(sample_id=sample_id)


def test_content_hash_is_canonical_over_role_content_and_thinking():
    from pathlib import Path

    from workers.contract.chats.jsonl import parse_row

    sharegpt = parse_row(json.dumps({"conversations": [{"from": "human", "value": "hi"},
                                                       {"from": "gpt", "value": "yo", "thinking": "hm"}]}),
                         path=Path("a"), line=1)
    openai = parse_row(json.dumps({"id": "x", "messages": [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "content": "yo",
                                                            "reasoning_content": "hm"}]}), path=Path("b"), line=9)
    assert sharegpt.content_hash == openai.content_hash == content_hash(openai.messages)
    assert len(sharegpt.content_hash) == 64
    assert (sharegpt.keyed_by_line, openai.keyed_by_line) == (True, False)
    assert content_hash([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]) \
        != sharegpt.content_hash  # the reasoning is trained on, so it is part of the conversation


def test_a_line_inserted_above_an_exclusion_skips_the_excluded_content_before_recataloguing(
        tiny_target, user, tmp_path, django_capture_on_commit_callbacks):
    chats = write(tmp_path / "chats.jsonl", [chat(i) for i in range(6)])
    dataset = catalogued(chats, django_capture_on_commit_callbacks)
    dataset.samples.filter(sample_id="2").update(excluded=True)
    write(chats, [chat("new"), *[chat(i) for i in range(6)]])  # question 2 is now id "3", question 1 id "2"
    ids, preparation = prepared_ids(tiny_target, user, chats, django_capture_on_commit_callbacks)
    assert ids == ["0", "1", "2", "4", "5", "6"]
    assert (preparation.num_excluded, preparation.num_conversations) == (1, 6)
    assert sample(dataset, "2").excluded and sample(dataset, "2").preview == "question 2"  # not re-catalogued yet


def test_recataloguing_moves_exclusion_tags_and_notes_with_the_content_and_logs_it(
        tiny_target, user, tmp_path, django_capture_on_commit_callbacks):
    chats = write(tmp_path / "chats.jsonl", [chat(i) for i in range(6)])
    dataset = catalogued(chats, django_capture_on_commit_callbacks)
    dataset.samples.filter(sample_id="2").update(excluded=True, tags="noisy", notes="wrong answer")
    dataset.samples.filter(sample_id="0").update(tags="short")
    dataset.samples.filter(sample_id="5").update(excluded=True)  # the last line: its new id is not catalogued yet
    write(chats, [chat("new"), *[chat(i) for i in range(6)]])
    catalogued(chats, django_capture_on_commit_callbacks)
    catalogue = dataset.catalogues.order_by("-pk").first()
    assert (catalogue.samples_added, catalogue.samples_total) == (1, 7)

    moved = sample(dataset, "3")
    assert (moved.preview, moved.excluded, moved.tags, moved.notes) == ("question 2", True, "noisy", "wrong answer")
    assert moved.content_hash == content_hash(chat(2)["messages"])
    now_other = sample(dataset, "2")
    assert (now_other.preview, now_other.excluded, now_other.tags, now_other.notes) == ("question 1", False, "", "")
    assert (sample(dataset, "1").tags, sample(dataset, "0").tags) == ("short", "")
    assert sample(dataset, "0").preview == "question new"
    assert sample(dataset, "6").excluded and sample(dataset, "6").preview == "question 5"
    assert set(dataset.samples.filter(excluded=True).values_list("sample_id", flat=True)) == {"3", "6"}

    rekeys = {tuple(a.sample_ids): a.detail for a in CurationAction.objects.filter(dataset=dataset, action="rekey")}
    assert rekeys[("2", "3")] == ("excluded, tags 'noisy', notes followed its conversation from id 2 to id 3 "
                                  "(line 4)")
    assert rekeys[("0", "1")].startswith("tags 'short' followed its conversation from id 0 to id 1")
    assert rekeys[("5", "6")].startswith("excluded followed its conversation from id 5 to id 6")
    assert rekeys[("2",)].startswith("id 2 now holds another conversation (line 3); its excluded, tags 'noisy', "
                                     "notes cleared here")
    assert {("0",), ("5",)} <= set(rekeys) and len(rekeys) == 6
    assert all(a.user is None for a in CurationAction.objects.filter(action="rekey"))

    ids, preparation = prepared_ids(tiny_target, user, chats, django_capture_on_commit_callbacks)
    assert ids == ["0", "1", "2", "4", "5"] and preparation.num_excluded == 2
    catalogued(chats, django_capture_on_commit_callbacks)  # nothing changed: nothing moves again
    assert CurationAction.objects.filter(dataset=dataset, action="rekey").count() == 6


def test_rows_with_their_own_id_keep_curation_on_the_id(
        tiny_target, user, tmp_path, django_capture_on_commit_callbacks):
    same = chat("same")  # identical conversations under different ids: excluding one keeps the others
    chats = write(tmp_path / "chats.jsonl", [{"id": f"c{i}", **same} for i in range(4)])
    dataset = catalogued(chats, django_capture_on_commit_callbacks)
    dataset.samples.filter(sample_id="c2").update(excluded=True, tags="dup")
    write(chats, [{"id": "top", **chat("new")}, *[{"id": f"c{i}", **same} for i in range(4)]])
    ids, preparation = prepared_ids(tiny_target, user, chats, django_capture_on_commit_callbacks)
    assert ids == ["top", "c0", "c1", "c3"] and preparation.num_excluded == 1
    catalogued(chats, django_capture_on_commit_callbacks)
    c2 = sample(dataset, "c2")
    assert (c2.excluded, c2.tags, c2.line) == (True, "dup", 4)  # the line follows the file; curation the id
    assert list(dataset.samples.filter(excluded=True).values_list("sample_id", flat=True)) == ["c2"]
    assert not CurationAction.objects.filter(action="rekey").exists()


def test_an_old_catalogue_without_hashes_gets_them_and_keeps_its_curation(
        tmp_path, django_capture_on_commit_callbacks):
    rows = [chat(i) for i in range(5)]
    chats = write(tmp_path / "chats.jsonl", rows)
    dataset = catalogued(chats, django_capture_on_commit_callbacks)
    dataset.samples.update(content_hash="")  # as migration 0018 leaves a catalogue made before it
    dataset.samples.filter(sample_id="2").update(excluded=True, tags="noisy")
    assert dataset_exclusions(dataset=dataset).ids == {"2"}  # matched by id until the hash is known
    assert dataset_exclusions(dataset=dataset).hashes == frozenset()

    write(chats, [*rows, chat(5)])
    catalogued(chats, django_capture_on_commit_callbacks)
    hashes = dict(dataset.samples.values_list("sample_id", "content_hash"))
    assert hashes == {str(i): content_hash(chat(i)["messages"]) for i in range(6)}
    kept = sample(dataset, "2")
    assert (kept.excluded, kept.tags) == (True, "noisy")
    excluded = dataset_exclusions(dataset=dataset)
    assert (excluded.ids, excluded.hashes, excluded.own_ids) == (frozenset(), {hashes["2"]}, {"2"})
    assert not CurationAction.objects.filter(action="rekey").exists()
