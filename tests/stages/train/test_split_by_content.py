"""Held out by content: no validation row and no τ prompt has a prompt context that training also has,
for our loop and for speculators' trainer, on chats shaped like users' (both formats prepare reads, up
to six turns, odd unicode, rows without an id, prompts repeated under new ids).

The chats hold CONVERSATIONS_SHARING conversations whose prompt context also occurs in another
conversation, built in below; a text-level oracle over the chat file (not the token keys under test)
confirms that number, and the split must report exactly it, whatever the seed."""
import json

import pytest
from django.db import transaction

from workers.stages.evaluate.prompts import prompts_from_prepared
from workers.contract.chats.prompt_source import validation_rows
from workers.stages.train.holdout.prompt_keys import context_key, prompt_context, prompt_context_keys, read_prompt_keys
from workers.stages.train.holdout.split import split_record, split_train_val, write_split
from workers.stages.train.with_speculators.plan import read_rows, speculators_split
from workers.stages.train.with_speculators.split_data import SplitDataError, split_data_dir, write_split_data

ODD = ["👩\u200d👩\u200d👧\u200d👦", "cafe\u0301", "שלום עולם", "مرحبا", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "zero\u200bwidth", "ı İ ß ẞ",
       "\u00a0nbsp\u00a0", "line\u2028sep", "🇫🇷🇯🇵", "Ω≈ç√∫", "ｆｕｌｌｗｉｄｔｈ", "tab\there", "𓀀𓁐", "ẞ—«»"]
SHAREGPT_ROLE = {"user": "human", "assistant": "gpt", "system": "system"}


def _chat(first_user: str, pairs: int, tag: str, *, system: str | None = None, greeting: str | None = None) -> list:
    turns = ([{"role": "system", "content": system}] if system else []) + \
            ([{"role": "assistant", "content": greeting}] if greeting else [])
    for k in range(pairs):
        turns.append({"role": "user", "content": first_user if k == 0 else f"and then {k} {ODD[k % len(ODD)]}?"})
        turns.append({"role": "assistant", "content": f"reply {tag}.{k} {ODD[(k + 3) % len(ODD)]}"})
    return turns


def _row(messages: list, row_id: str | None, *, sharegpt: bool) -> dict:
    row = ({"conversations": [{"from": SHAREGPT_ROLE[m["role"]], "value": m["content"]} for m in messages]}
           if sharegpt else {"messages": messages})
    return row if row_id is None else {"id": row_id, **row}


def build_chats() -> list[dict]:
    rows = []
    for i in range(48):  # unique prompts: 1-6 turns, some with a system turn, a greeting first, or no id
        chat = _chat(f"{ODD[i % len(ODD)]} question {i}: what is {i} + {i + 1}?", 1 + i % 6, f"u{i}",
                     system=f"You are helpful ✨ #{i % 2}" if i % 3 == 0 else None,
                     greeting="Hello! 👋" if i % 11 == 5 else None)
        rows.append(_row(chat, None if i % 13 == 7 else f"conv-{i:03d}", sharegpt=i % 2 == 0))
    # Repeated prompts under new ids, CONVERSATIONS_SHARING in all:
    verbatim = _chat("Translate «ẞ» and 👩\u200d👩\u200d👧\u200d👦 please", 4, "v")
    rows += [_row(verbatim, "fam-verbatim-a", sharegpt=True), _row(verbatim, "fam-verbatim-b", sharegpt=False)]  # 2
    for n in range(3):  # same system and user turn, other replies and later turns: 3
        rows.append(_row(_chat("Summarise: שלום / مرحبا / cafe\u0301", 2 + n, f"s{n}", system="Be brief ✂"),
                         f"fam-system-{n}", sharegpt=n == 1))
    for n in range(4):  # a short greeting asked four times: 4
        rows.append(_row(_chat("hi 👋", 1 + n, f"h{n}"), f"fam-hi-{n}", sharegpt=n % 2 == 0))
    for n in range(2):  # a long one whose first turn repeats, six turns each: 2
        rows.append(_row(_chat("𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ẞ\u2028 line — explain", 6, f"l{n}"), f"fam-long-{n}", sharegpt=n == 0))
    for n in range(2):  # an assistant greeting before the first user turn, then the same question: 2
        rows.append(_row(_chat("What's 2+2? 🤔", 2, f"g{n}", greeting="Hi, ask me anything 🙂"), f"fam-greet-{n}",
                         sharegpt=n == 1))
    # Look-alikes that are other prompts: the "Summarise" turn without the system turn, "hi 👋" asked
    # after another turn, and "café" in NFC where the family above wrote NFD.
    rows.append(_row(_chat("Summarise: שלום / مرحبا / cafe\u0301", 2, "ns"), "alike-no-system", sharegpt=False))
    rows.append(_row([{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "hi 👋"}, {"role": "assistant", "content": "hey"}],
                     "alike-later-turn", sharegpt=True))
    rows.append(_row(_chat("Summarise: שלום / مرحبا / caf\u00e9", 2, "nfc", system="Be brief ✂"), "alike-nfc",
                     sharegpt=True))
    return rows


CONVERSATIONS_SHARING = 2 + 3 + 4 + 2 + 2


def oracle_sharing(rows: list[dict]) -> set[str]:
    """Conversations one of whose replies follows the same turns (role and text) as a reply of another
    conversation: computed from the chat file's texts, independently of token ids and prompt keys."""
    contexts: dict[tuple, set[str]] = {}
    for line, row in enumerate(rows):
        sid = str(row.get("id", line))
        turns = [(m.get("role") or {"human": "user", "gpt": "assistant"}.get(m.get("from"), m.get("from")),
                  m.get("content", m.get("value"))) for m in row.get("messages") or row["conversations"]]
        for j, (role, _) in enumerate(turns):
            if role == "assistant" and j > 0:
                contexts.setdefault(tuple(turns[:j]), set()).add(sid)
    return {sid for owners in contexts.values() if len(owners) > 1 for sid in owners}


@pytest.fixture(scope="module")
def chats(tiny_target, tmp_path_factory):
    from workers.stages.prepare.stage import prepare

    root = tmp_path_factory.mktemp("content-split")
    rows = build_chats()
    path = root / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    prepared = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=path, out_dir=root / "prepared",
                       max_seq_len=2048)
    assert prepared.num_turns_dropped == 0 and prepared.num_conversations == len(rows)
    facts = read_rows(prepared.out_dir)
    from datasets import load_from_disk

    data = load_from_disk(str(prepared.out_dir)).with_format(None)
    return {"root": root, "rows": rows, "prepared": prepared, "facts": facts,
            "input_ids": data["input_ids"], "loss_mask": data["loss_mask"]}


def test_the_chats_hold_the_known_number_of_conversations_sharing_a_prompt_context(chats):
    shared = oracle_sharing(chats["rows"])
    assert len(shared) == CONVERSATIONS_SHARING
    assert not {s for s in shared if s.startswith("alike-") or s.startswith("conv-")}


def test_keys_depend_on_the_ids_alone_and_are_the_evaluated_prompt(chats):
    from datasets import Dataset, Sequence, Value, load_from_disk

    stored = load_from_disk(str(chats["prepared"].out_dir))
    keys = prompt_context_keys(stored)
    assert keys == chats["facts"].prompt_keys == read_prompt_keys(chats["prepared"].out_dir)
    assert sum(k is not None for k in keys) == len(keys) and len(set(keys)) < len(keys)
    as_int32 = Dataset.from_dict({"input_ids": chats["input_ids"], "loss_mask": chats["loss_mask"]}).cast_column(
        "input_ids", Sequence(Value("int32")))
    assert prompt_context_keys(as_int32.with_format("torch")) == keys  # upstream's prepare-data writes int32
    for i in (0, 5, len(keys) - 1):
        assert keys[i] == context_key(prompt_context(chats["input_ids"][i], chats["loss_mask"][i]))
    # A row with no context before its first supervised token has no key (nothing to compare).
    assert prompt_context_keys(Dataset.from_dict({"input_ids": [[1, 2]], "loss_mask": [[1, 1]]})) == [None]


def _contexts_of(chats, rows: list[int]) -> set[tuple]:
    """The ids before each row's first supervised token, cut here rather than by the code under test."""
    return {tuple(chats["input_ids"][i][:chats["loss_mask"][i].index(1)]) for i in rows}


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("val_fraction", [0.1, 0.3])
def test_no_validation_row_or_prompt_shares_its_context_with_training(chats, tmp_path, seed, val_fraction):
    facts = chats["facts"]
    train_rows, val_rows, info = split_train_val(facts.source_ids, val_fraction=val_fraction, seed=seed,
                                                 prompt_keys=facts.prompt_keys)
    assert info.held_out_duplicates_removed == CONVERSATIONS_SHARING
    train_ids, val_ids = {facts.source_ids[i] for i in train_rows}, {facts.source_ids[i] for i in val_rows}
    assert not train_ids & val_ids and val_ids and not val_ids & oracle_sharing(chats["rows"])
    assert not _contexts_of(chats, val_rows) & _contexts_of(chats, train_rows)
    assert len(val_rows) >= round(len(facts.source_ids) * val_fraction)  # filled from the other conversations
    # The τ prompts, as the evaluate stage picks them from split.json: one per held-out conversation, and
    # none of them is the start of any row the draft trains on.
    write_split(tmp_path, split_record(train_rows, val_rows, info, facts.source_ids))
    prompts = prompts_from_prepared(chats["prepared"].out_dir, validation_rows(tmp_path), limit=10_000)
    assert len(prompts) == info.val_conversations
    for i in train_rows:
        trained = chats["input_ids"][i]
        assert not any(trained[:len(p)] == p for p in prompts)
    assert json.loads((tmp_path / "split.json").read_text())["held_out_duplicates_removed"] == CONVERSATIONS_SHARING


def test_by_id_alone_validation_would_hold_prompts_the_draft_trains_on(chats):
    """What the split did before: the same seeds put repeated prompts on both sides."""
    facts, sharing = chats["facts"], oracle_sharing(chats["rows"])
    leaked = []
    for seed in range(8):
        train_rows, val_rows, info = split_train_val(facts.source_ids, val_fraction=0.3, seed=seed)
        assert info.held_out_duplicates_removed is None  # nothing compared: said so, not 0
        leaked.append(_contexts_of(chats, val_rows) & _contexts_of(chats, train_rows))
        assert bool(leaked[-1]) <= bool({facts.source_ids[i] for i in val_rows} & sharing)
    assert any(leaked)


@pytest.mark.parametrize("seed", [0, 1])
def test_speculators_reads_our_split_by_seed_conversations_whole_and_nothing_straddles(chats, tmp_path, seed):
    from datasets import load_from_disk
    from speculators.train.data import ArrowDataset

    facts = chats["facts"]
    split = speculators_split(facts.source_ids, num_rows=len(facts.lengths), val_fraction=0.2, seed=seed,
                              prompt_keys=facts.prompt_keys)
    ours = split_train_val(facts.source_ids, val_fraction=0.2, seed=seed, prompt_keys=facts.prompt_keys)
    assert (split.order[:split.train_rows], split.order[split.train_rows:], split.info) == ours
    assert split.info.held_out_duplicates_removed == CONVERSATIONS_SHARING and split.info.by == "conversation"
    # The directory speculators trains from: links folder as the run has it, fake hidden-state files.
    hs_dir, links = tmp_path / "hidden_states", tmp_path / "speculators_data"
    hs_dir.mkdir()
    links.mkdir()
    for i in range(len(facts.lengths)):
        (hs_dir / f"hs_{i}.safetensors").write_text(str(i))
    (links / "d2t-64.npy").symlink_to(tmp_path / "d2t-64.npy")
    (tmp_path / "d2t-64.npy").write_text("d2t")
    ordered = write_split_data(prepared_dir=chats["prepared"].out_dir, hidden_states_dir=hs_dir, links_dir=links,
                               order=split.order, out_dir=split_data_dir(links))
    assert ordered == tmp_path / "speculators_data_split" and (ordered / "d2t-64.npy").read_text() == "d2t"
    sides = {}
    for side in ("train", "val"):  # speculators' own reader, as its trainer builds it from our ratio
        data = ArrowDataset(max_len=2048, datapath=str(ordered), on_missing="raise",
                            train_ratio=split.train_data_ratio, split=side)
        rows = split.order[:split.train_rows] if side == "train" else split.order[split.train_rows:]
        assert data.data.with_format(None)["input_ids"] == [chats["input_ids"][i] for i in rows]
        for index in (0, len(rows) - 1):  # its hidden states: the extraction's file of that prepared row
            hs = ordered / "hidden_states" / f"hs_{data._map_to_file_idx(index)}.safetensors"
            assert hs.read_text() == str(rows[index])
        sides[side] = {facts.source_ids[i] for i in rows}
    assert sides["train"] and sides["val"] and not sides["train"] & sides["val"]  # no straddler
    assert not sides["val"] & oracle_sharing(chats["rows"])
    assert load_from_disk(str(ordered)).format["type"] == load_from_disk(str(chats["prepared"].out_dir)).format["type"]
    # Every validation conversation is whole: all its prepared rows validate.
    for sid in sides["val"]:
        assert {i for i, s in enumerate(facts.source_ids) if s == sid} <= set(split.order[split.train_rows:])
    # Written again (a retry) in place; a folder it did not write is never replaced.
    assert write_split_data(prepared_dir=chats["prepared"].out_dir, hidden_states_dir=hs_dir, links_dir=links,
                            order=split.order, out_dir=ordered) == ordered
    (tmp_path / "mine").mkdir()
    with pytest.raises(SplitDataError, match="not written by the train stage"):
        write_split_data(prepared_dir=chats["prepared"].out_dir, hidden_states_dir=hs_dir, links_dir=links,
                         order=split.order, out_dir=tmp_path / "mine")


def test_two_seeds_give_speculators_different_validation_sets(chats):
    facts = chats["facts"]
    val = [frozenset(speculators_split(facts.source_ids, num_rows=len(facts.lengths), val_fraction=0.2, seed=s,
                                       prompt_keys=facts.prompt_keys).record["val_conversations"]) for s in (0, 1)]
    assert val[0] and val[1] and val[0] != val[1]


def test_when_every_conversation_repeats_a_prompt_nothing_can_be_held_out(chats):
    from workers.stages.train.holdout.split import SplitError

    with pytest.raises(SplitError, match="every one of the 3 conversations shares a prompt context"):
        split_train_val(["a", "b", "b", "c"], val_fraction=0.3, seed=0, prompt_keys=["k", "k", "x", "k"])


def test_our_loop_records_the_split_by_content_for_the_run(chats, tiny_target):
    """The real stages on these chats: extract, vocab, one epoch of our loop; its split.json and result."""
    from workers.contract.target import default_layer_ids
    from workers.stages.extract.with_transformers import extract
    from workers.stages.train.loop import train
    from workers.stages.vocab import build_vocab

    run = chats["root"] / "run"
    layer_ids = default_layer_ids(tiny_target.num_layers)
    extract(target_dir=tiny_target.target_dir, prepared_dir=chats["prepared"].out_dir, out_dir=run / "extraction",
            layer_ids=layer_ids, device="cpu")
    vocab = build_vocab(token_freq_path=chats["prepared"].token_freq_path, out_dir=run / "vocab", draft_vocab_size=64,
                        target_vocab_size=tiny_target.vocab_size)
    announced = []
    result = train(target_dir=tiny_target.target_dir, prepared_dir=chats["prepared"].out_dir,
                   hidden_states_dir=run / "extraction" / "hidden_states", d2t_path=vocab.d2t_path,
                   t2d_path=vocab.t2d_path, out_dir=run / "checkpoints", layer_ids=layer_ids, epochs=1, lr=1e-3,
                   ttt_steps=2, draft_vocab_size=64, val_fraction=0.2, seed=3, device="cpu",
                   on_split=announced.append)
    assert result.split.held_out_duplicates_removed == CONVERSATIONS_SHARING
    assert announced == [result.split.as_dict()]
    written = json.loads((run / "checkpoints" / "split.json").read_text())
    assert written["held_out_duplicates_removed"] == CONVERSATIONS_SHARING
    assert not _contexts_of(chats, written["val_rows"]) & _contexts_of(chats, written["train_rows"])


@pytest.fixture
def launched_run(tmp_path, settings, user, django_capture_on_commit_callbacks):
    from runs.pipeline import services
    from runs.pipeline.launch.run_config import RunConfig

    data = tmp_path / "data"
    (data / "target").mkdir(parents=True)
    settings.EAGLE3WEB_DATA_ROOTS = [data.resolve()]
    (data / "target" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64,
        "vocab_size": 5000}))
    (data / "chats.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in build_chats()))
    with django_capture_on_commit_callbacks(execute=False):
        return services.run_launch(user=user, target_path=data / "target", dataset_path=data / "chats.jsonl",
                                   config=RunConfig(max_seq_len=2048))


@pytest.mark.django_db
def test_the_run_page_and_summary_show_how_many_conversations_were_kept_out(chats, launched_run, client, user,
                                                                            django_capture_on_commit_callbacks):
    """Through the service the train task calls as soon as the split is made (on_split)."""
    from runs.models import StageStatus, TrainingRun
    from runs.pipeline import selectors
    from runs.pipeline.status.run_summary import run_summary
    from runs.pipeline.lifecycle.stage_services import training_split_record

    facts = chats["facts"]
    _, _, info = split_train_val(facts.source_ids, val_fraction=0.1, seed=0, prompt_keys=facts.prompt_keys)
    training = TrainingRun.objects.get(run=launched_run)
    client.login(username=user.username, password=user.raw_password)
    before = client.get(launched_run.get_absolute_url()).content.decode()
    assert '<td data-token="split_duplicates">–</td>' in before  # no split yet
    with django_capture_on_commit_callbacks(execute=True):  # the page's cache counts the writes on commit
        TrainingRun.objects.filter(pk=training.pk).update(status=StageStatus.RUNNING)
        training_split_record(training_run_id=training.pk, split=info.as_dict())
    summary = run_summary(selectors.run_list().get(pk=launched_run.pk))  # what run_pipeline --json prints
    train = next(s for s in summary["stages"] if s["name"] == "train")
    assert train["split"]["held_out_duplicates_removed"] == CONVERSATIONS_SHARING
    assert json.loads(json.dumps(summary))["training"]["split"]["held_out_duplicates_removed"] == CONVERSATIONS_SHARING
    page = client.get(launched_run.get_absolute_url()).content.decode()
    assert (f'<td data-token="split_duplicates">{CONVERSATIONS_SHARING} conversations whose prompt context also '
            'occurs in another conversation (they train)</td>') in page
    api = client.get(f"/api/v1/runs/{launched_run.pk}/status/").json()
    api_train = next(s for s in api["stages"] if s["name"] == "train")
    assert api_train["split"]["held_out_duplicates_removed"] == CONVERSATIONS_SHARING
    # A split recorded before content was compared has no count: the page says nothing rather than 0.
    # In a savepoint of its own, as a request's write is in a transaction of its own: the page counts it once
    # (runs.pipeline.status.changes moves a counter once per transaction; this test's transaction never commits).
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        TrainingRun.objects.filter(pk=training.pk).update(split={k: v for k, v in info.as_dict().items()
                                                                 if k != "held_out_duplicates_removed"})
    assert '<td data-token="split_duplicates">–</td>' in client.get(launched_run.get_absolute_url()).content.decode()
