"""Bad-input corpus: extraction manifests (data_config.json, sample_lengths.json) an import reads.
Each is refused before an Extraction or a Manifest row is stored, naming the field."""
import json

import pytest

from runs.data.extractions import extraction_import
from runs.models import Extraction, Manifest, TargetModel
from workers.contract.extraction.layout import ManifestError
from workers.contract.errors import InputError

pytestmark = pytest.mark.django_db


def flat(**over) -> dict:
    m = {"model_path": "/models/tiny", "layer_ids": [2, 4, 5, 7], "max_seq_len": 64, "total_samples": 4,
         "total_tokens": 24, "data_format_version": 1, "hidden_size": 16, "num_layers_captured": 4}
    m.update(over)
    return m


def v04(**over) -> dict:
    m = {"version": "2.0", "model": {"target_model_path": "/models/tiny", "hidden_size": 16},
         "data": {"seq_length": 64, "num_samples": 4}, "hidden_states": {"layer_ids": [2, 4, 5, 7]}}
    m.update(over)
    return m


def refused_import(root, config_only_target, manifest: str, lengths: str | None = None) -> str:
    root.mkdir(parents=True)
    (root / "data_config.json").write_text(manifest)
    if lengths is not None:
        (root / "sample_lengths.json").write_text(lengths)
    before = (Extraction.objects.count(), Manifest.objects.count(), TargetModel.objects.count())
    with pytest.raises(InputError) as err:
        extraction_import(path=root, target_path=config_only_target)
    assert (Extraction.objects.count(), Manifest.objects.count(), TargetModel.objects.count()) == before
    return str(err.value)


@pytest.mark.parametrize(
    "manifest, field",
    [
        (flat(dtype="x" * 40), "'dtype'"),
        (flat(dtype=7), "'dtype'"),
        (flat(layer_id_convention="c" * 60), "'layer_id_convention'"),
        (flat(layer_id_convention=3), "'layer_id_convention'"),
        (flat(model_path="/m/" + "p" * 2000), "'model_path'"),
        (flat(layer_ids=list(range(2000))), "'layer_ids'"),
        (flat(layer_ids=[2, 5000]), "'layer_ids'"),
        (flat(layer_ids=[2, "4"]), "'layer_ids'"),
        (flat(layer_ids=[-1, 4]), "'layer_ids'"),
        (flat(hidden_size=10**12), "'hidden_size'"),
        (flat(hidden_size=16.0), "'hidden_size'"),
        (flat(total_samples=-1), "'total_samples'"),
        (flat(total_samples=2**40), "'total_samples'"),
        (flat(total_tokens=1.5), "'total_tokens'"),
        (flat(max_seq_len=10**12), "'max_seq_len'"),
        (flat(data_format_version=True), "'data_format_version'"),
        (v04(model={"target_model_path": "/models/tiny", "hidden_size": 10**9}), "'model.hidden_size'"),
    ],
    ids=["dtype-40-chars", "dtype-int", "convention-60-chars", "convention-int", "model-path-2000-chars",
         "2000-layer-ids", "layer-id-5000", "layer-id-string", "layer-id-negative", "hidden-1e12",
         "hidden-float", "samples-negative", "samples-2**40", "tokens-float", "seq-len-1e12",
         "version-bool", "v04-hidden-1e9"],
)
def test_manifest_fields_are_bounded_and_typed(tmp_path, config_only_target, manifest, field):
    lengths = json.dumps({"0": 5, "1": 9, "2": 3, "3": 7}) if "version" in manifest else None
    message = refused_import(tmp_path / "ext", config_only_target, json.dumps(manifest), lengths)
    assert f"field {field}" in message and "data_config.json" in message


def test_a_deeply_nested_manifest_is_refused(tmp_path, config_only_target):
    manifest = json.dumps(flat())[:-1] + ', "extra": ' + "[" * 20_000 + "]" * 20_000 + "}"
    message = refused_import(tmp_path / "ext", config_only_target, manifest)
    assert "data_config.json: nested deeper than 64 levels" in message


def test_sample_lengths_with_a_5000_digit_index_is_refused(tmp_path, config_only_target):
    lengths = '{"' + "9" * 5000 + '": 5}'
    message = refused_import(tmp_path / "ext", config_only_target, json.dumps(v04()), lengths)
    assert "sample_lengths.json: entry" in message and "index -> token count" in message


def test_a_manifest_with_a_nul_string_is_refused(tmp_path, config_only_target):
    message = refused_import(tmp_path / "ext", config_only_target, json.dumps(flat(note="a\u0000b")))
    assert "data_config.json" in message and "NUL character" in message


def test_manifest_error_is_an_input_error():
    assert issubclass(ManifestError, InputError)
