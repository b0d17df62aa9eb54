"""import_checkpoint DIR --verifier PATH: a draft trained on another machine, relinked to a local target.

The checkpoint is a real speculators Eagle3DraftModel saved with save_pretrained for a small
random Llama, then its config.json is edited the way it reads after travelling: the recorded
verifier path is the other machine's.
"""
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from runs.models import Checkpoint

pytestmark = pytest.mark.django_db

LAYERS, WIDTH, VOCAB, DRAFT_VOCAB = 8, 32, 256, 64
ELSEWHERE = "/models/on-another-machine/tiny-llama"


def _llama(path: Path, **over) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = dict(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=64, num_hidden_layers=LAYERS,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg.update(over)
    LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def made_elsewhere(tmp_path_factory):
    """(target the checkpoint was trained for, checkpoint directory recording ELSEWHERE as its verifier)."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from workers.contract.target import default_layer_ids
    from workers.stages.train.draft.model import build_draft_model

    work = tmp_path_factory.mktemp("ckpt-src")
    target = _llama(work / "target")
    d2t, t2d = build_vocab_mappings_from_distribution({i: VOCAB - i for i in range(VOCAB)}, DRAFT_VOCAB, VOCAB)
    np.save(work / "d2t.npy", d2t.numpy())
    np.save(work / "t2d.npy", t2d.numpy())
    draft = build_draft_model(target_dir=target, layer_ids=default_layer_ids(LAYERS), d2t_path=work / "d2t.npy",
                              t2d_path=work / "t2d.npy", draft_vocab_size=DRAFT_VOCAB, ttt_steps=2)
    ckpt = work / "ckpt" / "3"
    draft.save_pretrained(str(ckpt))
    config = json.loads((ckpt / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = ELSEWHERE
    (ckpt / "config.json").write_text(json.dumps(config))
    return target, ckpt


@pytest.fixture
def placed(made_elsewhere, data_root, tmp_path):
    """The checkpoint and a local copy of its target under the data roots, fresh per test."""
    target, ckpt = made_elsewhere
    here = tmp_path / "placed"  # tmp_path lies under the data roots
    shutil.copytree(ckpt, here / "ckpt" / "3")
    shutil.copytree(target, here / "target")
    return here / "ckpt" / "3", here / "target"


def run(*args) -> dict:
    out = io.StringIO()
    call_command("import_checkpoint", *map(str, args), "--json", stdout=out)
    return json.loads(out.getvalue())


def test_the_recorded_config_names_the_other_machines_verifier_and_its_shape(placed):
    ckpt, _ = placed
    config = json.loads((ckpt / "config.json").read_text())
    assert config["speculators_config"]["verifier"] == {"name_or_path": ELSEWHERE, "architectures": ["LlamaForCausalLM"]}
    layer = config["transformer_layer_config"]
    assert (layer["hidden_size"], layer["vocab_size"]) == (WIDTH, VOCAB)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]


def test_without_verifier_a_missing_recorded_path_says_to_pass_verifier(placed):
    ckpt, _ = placed
    with pytest.raises(CommandError, match=r"records verifier '/models/on-another-machine/tiny-llama'.*"
                                           r"pass --verifier PATH"):
        run(ckpt)
    assert Checkpoint.objects.count() == 0


def test_verifier_relinks_the_checkpoint_to_the_local_target(placed):
    ckpt, target = placed
    summary = run(ckpt, "--verifier", target)
    saved = Checkpoint.objects.get(pk=summary["checkpoint_id"])
    assert summary["created"] and saved.verifier_path == summary["verifier"] == str(target.resolve())
    assert saved.aux_layer_ids == [2, 4, 5] and saved.draft_vocab_size == DRAFT_VOCAB
    # the checkpoint's own files are untouched: its config still names the other machine
    assert json.loads((ckpt / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == ELSEWHERE
    again = run(ckpt, "--verifier", target)
    assert again == {**summary, "created": False} and Checkpoint.objects.count() == 1


def test_the_relinked_checkpoint_loads_with_the_local_verifiers_weights(placed):
    import torch
    from safetensors.torch import load_file

    from runs.checkpoints.imports import _load_draft

    ckpt, target = placed
    run(ckpt, "--verifier", target)
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(ckpt))
    config.speculators_config.verifier.name_or_path = str(target)
    model = Eagle3DraftModel.from_pretrained(str(ckpt), config=config)
    # verifier_lm_head is never saved in the checkpoint: it comes from the verifier named at load
    lm_head = load_file(str(target / "model.safetensors"))["lm_head.weight"]
    assert "verifier_lm_head.weight" not in load_file(str(ckpt / "model.safetensors"))
    want = lm_head[model.t2d.to(torch.bool)].to(model.verifier_lm_head.weight.dtype)
    assert torch.equal(model.verifier_lm_head.weight.detach(), want)
    _load_draft(ckpt, str(target))  # what the import ran, without raising


@pytest.mark.parametrize("change,field", [
    ({"hidden_size": 48}, "hidden width: .*transformer_layer_config.hidden_size 32, .* has hidden_size 48"),
    ({"vocab_size": 512}, "vocab: .*transformer_layer_config.vocab_size 256, .* has vocab_size 512"),
    ({"num_hidden_layers": 4}, r"layer count: .*eagle_aux_hidden_state_layer_ids \[2, 4, 5\], but .* has 4 layers"),
    ({"num_hidden_layers": 12}, r"layer count: .*speculators' default \[2, N//2, N-3\] for a 8-layer verifier; "
                                r".* has 12 layers"),
    ({"architectures": ["MistralForCausalLM"]},
     r"architecture: .*speculators_config.verifier.architectures \['LlamaForCausalLM'\], .* has \['MistralForCausalLM'\]"),
])
def test_a_verifier_of_another_shape_is_refused_naming_the_field(placed, change, field):
    ckpt, target = placed
    cfg_path = target / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **change}))
    with pytest.raises(CommandError, match=f"is not the verifier .* was trained for: {field}"):
        run(ckpt, "--verifier", target)
    assert Checkpoint.objects.count() == 0


def test_a_verifier_outside_the_data_roots_is_refused(placed, tmp_path_factory, settings):
    ckpt, _ = placed
    outside = tmp_path_factory.getbasetemp().parent / "not-a-root"
    with pytest.raises(CommandError, match="verifier directory"):
        run(ckpt, "--verifier", outside)
