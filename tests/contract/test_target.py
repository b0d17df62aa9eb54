import json

import pytest

from workers.contract.target import TargetConfigError, default_layer_ids, read_target_config, validate_layer_ids


def test_nested_text_config_wins(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["KimiK25"], "num_hidden_layers": 2,
                                                       "text_config": {"num_hidden_layers": 61, "hidden_size": 7168,
                                                                       "vocab_size": 163840}}))
    cfg = read_target_config(tmp_path)
    assert (cfg.num_layers, cfg.hidden_size, cfg.nested_text_config) == (61, 7168, True)


def test_missing_config_names_the_file(tmp_path):
    with pytest.raises(TargetConfigError, match=r"config.json is missing"):
        read_target_config(tmp_path)


def test_config_that_is_not_an_object_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(TargetConfigError, match="expected a JSON object"):
        read_target_config(tmp_path)


def test_a_bad_field_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": "32", "hidden_size": 4096, "vocab_size": 9}))
    with pytest.raises(TargetConfigError, match="num_hidden_layers must be a positive integer, got '32'"):
        read_target_config(tmp_path)


def test_eagle3_default_layers_for_kimi_and_llama():
    assert default_layer_ids(61) == [2, 30, 58, 61]
    assert default_layer_ids(32) == [2, 16, 29, 32]


def test_layer_ids_must_increase():
    with pytest.raises(TargetConfigError, match="strictly increasing"):
        validate_layer_ids([4, 2, 8], 8)
