"""The training step's attention and loss, memory linear in the step (CPU proofs of the CUDA path).

The CUDA path runs speculators' flex block mask through a compiled flex_attention, which has no
backward on the CPU; the CPU trains through a per-document twin. These tests hold the three
together: flex's compiled forward on the CPU equals the twin; the twin's loss and per-position
accuracies equal speculators' own eager forward (dense mask, eager KL) on a packed step; the
chunked KL's value and gradient equal speculators' eager KL; padding a step changes nothing; and
one step's peak memory grows linearly with the step's tokens, measured.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from speculators.models.eagle3.data import shift_batch
from speculators.train.data import CollateFn

from workers.contract.target import default_layer_ids, read_target_config
from workers.stages.train.draft.model import build_draft_model, model_call_kwargs
from workers.stages.torch_internals import compiled_graph_count
from workers.stages.train.step.packed_attention import document_attention, document_layout, flex_block_mask
from workers.stages.train.step.packed_step import (
    chunked_kl_div,
    draft_forward,
    kl_loss_config,
    padded_length,
    use_packed_attention,
)

TTT = 3
DRAFT_VOCAB = 256


@pytest.fixture(scope="module")
def draft_inputs(tiny_target, tmp_path_factory):
    """d2t/t2d for the tiny target and its config: enough to build a real draft."""
    target = read_target_config(tiny_target.target_dir)
    out = tmp_path_factory.mktemp("packed-vocab")
    rng = np.random.default_rng(0)
    draft_ids = np.sort(rng.choice(target.vocab_size, DRAFT_VOCAB, replace=False))
    d2t = draft_ids - np.arange(DRAFT_VOCAB)
    t2d = np.zeros(target.vocab_size, dtype=bool)
    t2d[draft_ids] = True
    np.save(out / "d2t.npy", d2t.astype(np.int64))
    np.save(out / "t2d.npy", t2d)
    return dict(target_dir=tiny_target.target_dir, layer_ids=default_layer_ids(target.num_layers),
                d2t_path=out / "d2t.npy", t2d_path=out / "t2d.npy", draft_vocab_size=DRAFT_VOCAB,
                ttt_steps=TTT), target


def _draft(draft_inputs):
    kwargs, _target = draft_inputs
    return build_draft_model(**kwargs, seed=0)


def packed_batch(target, lengths, *, seed=0, pad_to=None, vocab=None):
    """A packed step of documents of the given lengths, random hidden states, prompt-then-reply masks."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    num_layers = 4
    for length in lengths:
        hs = torch.randn(length, num_layers, target.hidden_size, generator=gen)
        mask = torch.zeros(length, dtype=torch.long)
        mask[length // 3:] = 1
        items.append(shift_batch({
            "hidden_states": hs[:, :-1].flatten(1), "verifier_last_hidden_states": hs[:, -1],
            "input_ids": torch.randint(0, vocab or target.vocab_size, (length,), generator=gen),
            "loss_mask": mask, "lengths": torch.tensor([length]), "position_ids": torch.arange(length)}))
    tokens = sum(int(it["lengths"][0]) for it in items)
    collate = CollateFn(pad_to or tokens, target.hidden_size, num_target_layers=num_layers - 1, dtype=torch.float32)
    batch = collate(items)
    batch.pop("error_records", None)
    return batch


def test_flex_attention_compiled_forward_on_the_cpu_equals_the_document_twin():
    torch.manual_seed(0)
    lengths = [200, 37, 300, 150, 81]  # 768 tokens, then 256 of padding: 1,024, a multiple of flex's 128
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)] + [torch.full((256,), -1)])
    total = ids.shape[0]
    heads, kv_heads, dim = 4, 2, 32
    q = torch.randn(1, heads, total, dim)
    for window in (None, 64):
        block = flex_block_mask(ids, window)
        layout = document_layout(ids, window)
        from speculators.models.eagle3.attention import extend_mask_for_draft_tokens
        from torch.nn.attention.flex_attention import flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
        for blocks in range(1, TTT + 1):
            k = torch.randn(1, kv_heads, blocks * total, dim)
            v = torch.randn(1, kv_heads, blocks * total, dim)
            with torch.no_grad():
                want = flex(q, k, v, block_mask=block, enable_gqa=True, scale=dim ** -0.5)
                got = document_attention(q, k, v, layout, dim ** -0.5)
            assert torch.allclose(got, want, atol=1e-5), (window, blocks, (got - want).abs().max())
            block = extend_mask_for_draft_tokens(block)


def test_the_twin_differs_from_flex_when_a_document_boundary_is_ignored():
    """The comparison above can fail: a layout that merges two documents gives other outputs."""
    ids = torch.cat([torch.zeros(64), torch.ones(64)]).long()
    q, k, v = torch.randn(1, 2, 128, 16), torch.randn(1, 2, 128, 16), torch.randn(1, 2, 128, 16)
    right = document_attention(q, k, v, document_layout(ids, None), 0.25)
    merged = document_attention(q, k, v, document_layout(torch.zeros(128).long(), None), 0.25)
    assert (right[:, :, 64:] - merged[:, :, 64:]).abs().max() > 1e-2


def test_twin_loss_and_accuracies_equal_speculators_eager_forward(draft_inputs):
    _kwargs, target = draft_inputs
    model = _draft(draft_inputs)  # draft_attn_impl="eager": speculators' dense float mask
    model.train()
    batch = packed_batch(target, [97, 40, 160, 63, 128], seed=1)
    eager_kwargs = model_call_kwargs(TTT)  # loss_implementation eager
    _tokens, want_loss, want = model(**batch, **eager_kwargs)
    want_loss.backward()
    want_grad = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    use_packed_attention(model)
    loss_config, name = kl_loss_config(torch.device("cpu"))
    assert name == "chunked"
    _tokens, got_loss, got = draft_forward(model, **batch, ttt_steps=TTT, loss_config=loss_config,
                                           attention="document")
    got_loss.backward()
    assert abs(float(got_loss) - float(want_loss)) < 1e-3
    for step in range(TTT):
        for key in (f"loss_{step}_sum", f"full_acc_{step}_sum", f"full_acc_{step}_total",
                    f"cond_acc_{step}_sum", f"cond_acc_{step}_total"):
            assert abs(float(got[key]) - float(want[key])) < 1e-3, key
    for n, g in want_grad.items():
        assert torch.allclose(dict(model.named_parameters())[n].grad, g, atol=1e-4, rtol=1e-3), n


def test_padding_a_step_changes_neither_loss_nor_accuracies(draft_inputs):
    _kwargs, target = draft_inputs
    model = _draft(draft_inputs)
    use_packed_attention(model)
    loss_config, _ = kl_loss_config(torch.device("cpu"))
    lengths = [97, 40, 160]
    exact = packed_batch(target, lengths, seed=2)
    tokens = exact["input_ids"].shape[1]
    padded = packed_batch(target, lengths, seed=2, pad_to=padded_length(tokens, 512))
    assert padded["input_ids"].shape[1] == 384 > tokens
    with torch.no_grad():
        _t, loss_a, m_a = draft_forward(model, **exact, ttt_steps=TTT, loss_config=loss_config, attention="document")
        _t, loss_b, m_b = draft_forward(model, **padded, ttt_steps=TTT, loss_config=loss_config, attention="document")
    assert abs(float(loss_a) - float(loss_b)) < 1e-5
    assert {k: round(float(v), 4) for k, v in m_a.items()} == {k: round(float(v), 4) for k, v in m_b.items()}


def test_chunked_kl_value_and_gradient_equal_speculators_eager_kl():
    from speculators.losses.eager import kl_div_loss

    torch.manual_seed(0)
    logits = torch.randn(1, 2500, 300, dtype=torch.float64) * 3  # rows over two chunks and a part
    targets = torch.randn(1, 2500, 300, dtype=torch.float64) * 3
    weights = torch.rand(1, 2500, dtype=torch.float64)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    got = chunked_kl_div(a, targets)
    want = kl_div_loss(b, targets)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    assert torch.allclose(got.double(), want.double(), atol=1e-5)
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


@pytest.mark.parametrize("tokens,budget,want", [(1, 8192, 2048), (2048, 8192, 2048), (2049, 8192, 4096),
                                                 (8192, 8192, 8192), (300, 1000, 512), (1000, 1000, 1024),
                                                 (100, 256, 128), (129, 256, 256)])
def test_steps_are_padded_to_a_few_multiples_of_the_flex_block(tokens, budget, want):
    assert padded_length(tokens, budget) == want


def test_one_steps_peak_memory_grows_linearly_with_its_tokens(draft_inputs, tmp_path):
    """Each size in a fresh process: the step's peak resident memory (VmHWM, reset before the step)
    above what the process held before it. Documents of 256 tokens; quadratic would be 16x."""
    kwargs, _target = draft_inputs
    peaks = {}
    for tokens in (1024, 4096):
        out = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("packed_step_memory.py")), json.dumps(
                {k: str(v) if isinstance(v, Path) else v for k, v in kwargs.items()}), str(tokens)],
            capture_output=True, text=True, timeout=600, check=True,
            env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"})
        peaks[tokens] = json.loads(out.stdout.strip().splitlines()[-1])["step_peak_bytes"]
    assert peaks[1024] > 0
    assert peaks[4096] <= 5 * peaks[1024], peaks


def test_three_epochs_of_varied_steps_compile_once_per_padded_length_cpu_forward_only(tiny_target, tmp_path):
    """The CUDA path (flex, compiled, padded steps) over three epochs' plans of rows of varied length.
    Forward only (validation's no_grad pass): flex attention has no backward on the CPU. A padded
    length compiles one graph per TTT step (the keys grow by a block each) the first time it comes;
    a step of a length seen before compiles nothing."""
    from tests.stages.train.test_train import write_training_inputs
    from workers.stages.train.data import HiddenStateSamples, batch_dtype, iter_batches, plan_training_steps
    from workers.stages.train.step.stepper import DraftStepper

    inputs = write_training_inputs(tiny_target.target_dir, tiny_target.chats_path, tmp_path, num_rows=40,
                                   draft_vocab_size=DRAFT_VOCAB)
    target = read_target_config(inputs.target_dir)
    samples = HiddenStateSamples(prepared_dir=inputs.prepared_dir, hidden_states_dir=inputs.hidden_states_dir,
                                 layer_ids=inputs.layer_ids, hidden_size=target.hidden_size)
    assert len(set(samples.lengths)) > 10  # rows of many lengths
    model = build_draft_model(target_dir=inputs.target_dir, layer_ids=inputs.layer_ids, d2t_path=inputs.d2t_path,
                              t2d_path=inputs.t2d_path, draft_vocab_size=DRAFT_VOCAB, ttt_steps=TTT)
    graphs_before = compiled_graph_count()  # dynamo's own count for the whole process, read apart from the stepper
    stepper = DraftStepper(model, device=torch.device("cpu"), ttt_steps=TTT, attention="flex")
    budget = 256
    lengths_seen, steps, recompiled = set(), 0, []
    for epoch in range(3):
        plan = plan_training_steps(samples.lengths, list(range(len(samples))), max_tokens=budget, seed=0, epoch=epoch)
        for batch in iter_batches(samples, plan, max_tokens=budget, dtype=batch_dtype(torch.device("cpu")),
                                  pad_to=lambda n: stepper.step_length(n, budget)):
            length, before = batch["input_ids"].shape[1], stepper.graphs_compiled()
            metrics = stepper.eval_step(batch)
            assert metrics["loss_total"] == 1.0
            if length in lengths_seen and stepper.graphs_compiled() != before:
                recompiled.append((epoch, length))
            lengths_seen.add(length)
            steps += 1
    assert lengths_seen <= {128, 256} and steps > 3 * len(lengths_seen)
    assert recompiled == []
    assert compiled_graph_count() - graphs_before == len(lengths_seen) * TTT == stepper.graphs_compiled()


def test_a_training_says_how_its_steps_ran_and_where_their_time_went(tiny_target, tmp_path):
    from tests.stages.train.test_train import write_training_inputs
    from workers.stages.train.loop import train

    inputs = write_training_inputs(tiny_target.target_dir, tiny_target.chats_path, tmp_path / "in", num_rows=24,
                                   draft_vocab_size=DRAFT_VOCAB)

    def run(name, **choice):
        points = []
        result = train(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir,
                       hidden_states_dir=inputs.hidden_states_dir, d2t_path=inputs.d2t_path, t2d_path=inputs.t2d_path,
                       out_dir=tmp_path / name, layer_ids=inputs.layer_ids, epochs=1, lr=3e-3, ttt_steps=TTT,
                       draft_vocab_size=DRAFT_VOCAB, max_tokens_per_step=256, on_metrics=points.extend, **choice)
        return result, [p["value"] for p in points if p["split"] == "train" and p["key"] == "loss"]

    graphs_before = compiled_graph_count()
    result, losses = run("auto")
    graphs_compiled = compiled_graph_count() - graphs_before  # dynamo's own count, read apart from the result
    # What the result says ran is what ran: a training told to use exactly that trains the same losses,
    # and one told to use speculators' eager KL says so and trains (nearly) the same ones another way.
    said = dict(part.split(" ") for part in result.step_config.split(", "))
    assert said["compute"] == "float32"
    same, same_losses = run("as-said", attention=said["attention"], loss_implementation=said["loss"])
    assert same.step_config == result.step_config and same_losses == losses
    eager, eager_losses = run("eager", attention=said["attention"], loss_implementation="eager")
    assert eager.step_config == result.step_config.replace(f"loss {said['loss']}", "loss eager")
    assert eager_losses == pytest.approx(losses, rel=1e-4)
    split = result.time_split_s
    assert set(split) == {"data", "copies", "forward", "backward", "optimizer"}
    assert split["forward"] > 0 and split["backward"] > 0 and split["optimizer"] > 0
    steps_time = result.train_tokens / result.tokens_per_second  # the steps' own time, validation excluded
    assert sum(split.values()) <= steps_time * 1.05
    assert sum(split.values()) >= steps_time * 0.5  # the phases cover most of a step
    assert result.step_lengths and max(result.step_lengths) <= result.tokens_per_step
    assert graphs_compiled == result.graphs_compiled == 0  # the CPU twin compiles nothing
