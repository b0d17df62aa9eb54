"""The evaluate stage: speculative decoding with the tiny demo target and real drafts, one trained by the
train stage and one untrained of the same shape. The trained draft is measured on the conversations its
training held out (split.json), as the product does. Known answers for tau (stand-in proposers) are in
test_tau_known_answers.py."""
from pathlib import Path

import pytest
import torch

from tests.stages.train.test_train import write_training_inputs
from workers.stages.evaluate.measure import DraftRunner, evaluate, load_draft
from workers.contract.chats.prompt_source import EvaluationInputError, validation_rows
from workers.stages.evaluate.prompts import prompts_from_file, prompts_from_prepared
from workers.stages.extract.model import load_target
from workers.stages.evaluate.speculative import TargetRunner
from workers.stages.train.draft.model import build_draft_model
from workers.stages.train.loop import train

K = 3


@pytest.fixture(scope="module")
def inputs(tiny_target, tmp_path_factory):
    return write_training_inputs(tiny_target.target_dir, tiny_target.chats_path, tmp_path_factory.mktemp("eval-in"),
                                 num_rows=64, draft_vocab_size=512)


@pytest.fixture(scope="module")
def trained_checkpoint(inputs, tmp_path_factory) -> Path:
    result = train(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir,
                   hidden_states_dir=inputs.hidden_states_dir, d2t_path=inputs.d2t_path, t2d_path=inputs.t2d_path,
                   out_dir=tmp_path_factory.mktemp("eval-ckpt"), layer_ids=inputs.layer_ids, epochs=4, lr=3e-3,
                   ttt_steps=K, draft_vocab_size=inputs.draft_vocab_size, val_fraction=0.1, seed=0)
    return next(c.path for c in result.checkpoints if c.is_best)


def untrained_draft(inputs):
    return build_draft_model(target_dir=inputs.target_dir, layer_ids=inputs.layer_ids, d2t_path=inputs.d2t_path,
                             t2d_path=inputs.t2d_path, draft_vocab_size=inputs.draft_vocab_size, ttt_steps=K, seed=1)


@pytest.fixture(scope="module")
def untrained_checkpoint(inputs, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("untrained")
    untrained_draft(inputs).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def prompts(inputs, trained_checkpoint):
    """The first-reply contexts of the conversations the trained draft never saw."""
    held_out = validation_rows(trained_checkpoint.parent)
    from datasets import load_from_disk

    rows = load_from_disk(str(inputs.prepared_dir)).with_format(None)
    trained_on = {tuple(rows[i]["input_ids"]) for i in range(len(rows)) if i not in held_out}
    prompts = prompts_from_prepared(inputs.prepared_dir, held_out, limit=6)
    assert len(prompts) == 6
    assert not any(tuple(row[:len(p)]) == tuple(p) for p in prompts for row in trained_on)
    return prompts


@pytest.fixture(scope="module")
def chat_prompts(tiny_target):
    """Prompts for drafts that never trained on anything (the untrained one)."""
    return prompts_from_file(tiny_target.chats_path, tiny_target.target_dir, limit=6)


@pytest.fixture(scope="module")
def trained_result(tiny_target, trained_checkpoint, prompts):
    return evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=trained_checkpoint, prompts=prompts,
                    prompt_source="held-out conversations", max_new_tokens=40)


def test_speculative_decoding_with_a_trained_draft_equals_greedy_decoding(trained_result):
    assert trained_result.num_prompts == 6
    assert trained_result.output_matches_greedy and trained_result.mismatched_prompts == []
    assert all(p.matches_greedy for p in trained_result.prompts)


def test_tau_of_the_trained_draft_is_emitted_tokens_per_verification_forward(trained_result):
    assert trained_result.num_speculative_tokens == K
    assert 1.0 <= trained_result.tau <= K + 1
    # The output's tokens after each prompt's prefill token, over the forwards that verified drafts:
    # drafts a last forward verified past max_new_tokens or EOS are not counted.
    emitted = trained_result.new_tokens - trained_result.num_prompts
    assert trained_result.tau == pytest.approx(emitted / trained_result.verify_forwards)
    assert trained_result.verify_forwards == sum(p.verify_forwards for p in trained_result.prompts)
    per_position = trained_result.acceptance_per_position
    assert len(per_position) == K and all(a >= b for a, b in zip(per_position, per_position[1:]))


def test_taus_standard_error_is_over_the_prompts_emitted_tokens_and_forwards(trained_result):
    # Read from each prompt's reply (its tokens after the prefill's, its forwards), not from the accepted lists.
    emitted = [p.new_tokens - 1 for p in trained_result.prompts]
    forwards = [p.verify_forwards for p in trained_result.prompts]
    n, tau = len(forwards), sum(emitted) / sum(forwards)
    assert tau == pytest.approx(trained_result.tau)
    spread = sum((t - tau * f) ** 2 for t, f in zip(emitted, forwards)) * n / (n - 1)
    assert trained_result.tau_standard_error == pytest.approx(spread ** 0.5 / sum(forwards))


def test_an_untrained_draft_gives_the_same_text_with_lower_tau(tiny_target, untrained_checkpoint, prompts,
                                                                 trained_result):
    untrained = evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=untrained_checkpoint, prompts=prompts,
                         prompt_source="held-out conversations", max_new_tokens=40)
    assert untrained.output_matches_greedy
    assert untrained.new_tokens == trained_result.new_tokens
    assert untrained.tau < trained_result.tau


def test_the_k_table_equals_a_separate_speculative_decode_at_each_k(tiny_target, trained_checkpoint, prompts,
                                                                     trained_result):
    """The table comes from one probing decode per prompt (workers.stages.evaluate.k_table); a separate
    speculative decode with the real trained draft at each k gives the same τ and acceptance by position."""
    from workers.stages.evaluate.measure import Eagle3Proposer
    from workers.stages.evaluate.speculative import eos_ids, measure

    table = trained_result.k_table
    assert table["k_max"] == K + 2 and list(table["rows"]) == [str(k) for k in range(1, K + 3)]
    model = load_target(tiny_target.target_dir, torch.device("cpu"))
    draft = load_draft(trained_checkpoint, model, torch.device("cpu"), torch.float32)
    taus = []
    for k in range(1, K + 3):
        separate = measure(model, prompts, aux_layer_ids=list(draft.target_layer_ids),
                           new_proposer=lambda _: Eagle3Proposer(draft), k=k, max_new_tokens=40, eos=eos_ids(model))
        row = table["rows"][str(k)]
        assert row["tau"] == pytest.approx(separate.tau, abs=1e-12), k
        assert row["acceptance_per_position"] == pytest.approx(separate.acceptance_per_position, abs=1e-12), k
        taus.append(separate.tau)
    assert table["rows"][str(K)]["tau"] == pytest.approx(trained_result.tau)
    assert taus[0] < taus[-1]  # the draft accepts something beyond its first position: the comparison bites
    best = max(range(1, K + 3), key=lambda k: (round(taus[k - 1] / (1 + table["draft_cost"] * k), 3), -k))
    assert trained_result.recommended_k == best and 0 < table["draft_cost"] < 1


def test_a_stop_asked_while_the_k_table_is_measured_ends_the_evaluation(tiny_target, trained_checkpoint, prompts):
    """The k table decodes every prompt again after the measurement proper: a cancel asked then must end the
    evaluation there, as it does during the measurement, not after every probing decode."""
    from workers.stages.evaluate.speculative import EvaluationStopped

    done = []
    with pytest.raises(EvaluationStopped, match="k table"):
        evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=trained_checkpoint, prompts=prompts[:2],
                 prompt_source="held-out conversations", max_new_tokens=8,
                 on_progress=lambda n, of: done.append(n), should_stop=lambda: len(done) >= 2)
    assert done == [1, 2]  # the measurement proper finished; the stop came in the k table's first prompt


def test_progress_counts_the_k_tables_probes_after_the_measurement(tiny_target, trained_checkpoint, prompts):
    """Progress reaches its total only when the k table is done (it said 2/2 while the probes ran as long again),
    says that total from its first call and never goes back; without a k table it counts the measurement alone."""
    reported, alone = [], []
    evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=trained_checkpoint, prompts=prompts[:2],
             prompt_source="held-out conversations", max_new_tokens=8, on_progress=lambda n, of: reported.append((n, of)))
    assert reported == [(1, 4), (2, 4), (3, 4), (4, 4)]
    evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=trained_checkpoint, prompts=prompts[:2], k_beyond=-1,
             prompt_source="held-out conversations", max_new_tokens=8, on_progress=lambda n, of: alone.append((n, of)))
    assert alone == [(1, 2), (2, 2)]


def test_k_can_be_set_below_the_checkpoints_own(tiny_target, trained_checkpoint, prompts):
    result = evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=trained_checkpoint, prompts=prompts[:2],
                      prompt_source="held-out conversations", max_new_tokens=20, num_speculative_tokens=1)
    assert result.num_speculative_tokens == 1 and len(result.acceptance_per_position) == 1
    assert result.output_matches_greedy and 1.0 <= result.tau <= 2.0


@torch.inference_mode()
def test_the_draft_is_fed_exactly_as_speculators_trains_it(inputs, tiny_target, chat_prompts):
    """Context entries and chain steps give the tokens speculators' own TTT forward gives at the same
    positions (teacher-forced inputs), so the inference path measures the model that was trained."""
    from transformers import DynamicCache

    draft = untrained_draft(inputs).eval()
    target_model = load_target(tiny_target.target_dir, torch.device("cpu"))
    target = TargetRunner(target_model, list(draft.target_layer_ids))
    seq = chat_prompts[0] + [5, 9, 11, 13, 17, 19]
    _, aux = target.forward(seq, DynamicCache())
    target.close()
    T = len(seq) - 1
    draft_tokens = draft(hidden_states=aux[:-1][None], input_ids=torch.tensor([seq[1:]]),
                         document_ids=torch.zeros(1, T, dtype=torch.long),
                         position_ids=torch.arange(1, T + 1)[None], ttt_steps=3)
    j = T - 4
    runner = DraftRunner(draft)
    hidden, logits = runner.extend(aux[: j + 1], seq[1 : j + 2])
    assert torch.equal(torch.argmax(logits[0], dim=-1), draft_tokens[0][0, : j + 1])
    hidden = hidden[:, -1:]
    for step in (1, 2):
        hidden, logits = runner.chain_step(seq[j + 1 + step], hidden, step)
        assert int(torch.argmax(logits[0, -1])) == int(draft_tokens[step][0, j])


def test_prompts_from_a_prepared_split_are_the_context_before_each_first_reply(inputs):
    prompts = prompts_from_prepared(inputs.prepared_dir, [0, 1, 2], limit=2)
    assert len(prompts) == 2
    from datasets import load_from_disk

    row = load_from_disk(str(inputs.prepared_dir)).with_format(None)[0]
    first = row["loss_mask"].index(1)
    assert prompts[0] == row["input_ids"][:first]


def test_a_directory_that_is_no_checkpoint_is_refused(tiny_target, tmp_path, chat_prompts):
    with pytest.raises(EvaluationInputError, match="config.json"):
        evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=tmp_path, prompts=chat_prompts,
                 prompt_source="demo chats")


def test_prompts_longer_than_the_target_allows_are_refused_naming_the_limit(tiny_target, untrained_checkpoint):
    with pytest.raises(EvaluationInputError, match="positions"):
        evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=untrained_checkpoint, prompts=[[1] * 5000],
                 prompt_source="long", max_new_tokens=8)


def test_load_draft_takes_embeddings_from_the_target_when_the_file_lacks_them(tiny_target, untrained_checkpoint,
                                                                             tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(untrained_checkpoint, tmp_path / "ckpt")
    weights = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert weights.pop("embed_tokens.weight", None) is not None
    save_file(weights, str(tmp_path / "ckpt" / "model.safetensors"), metadata={"format": "pt"})
    target_model = load_target(tiny_target.target_dir, torch.device("cpu"))
    draft = load_draft(tmp_path / "ckpt", target_model, torch.device("cpu"), torch.float32)
    assert torch.equal(draft.embed_tokens.weight, target_model.get_input_embeddings().weight)
