"""The serve command pages print: the form vLLM accepts for local and hub verifiers (its CLI is a
boundary we cannot run here: the command is parsed back as a shell would, not executed)."""
import json
import shlex

import pytest

from workers.contract.checkpoints.serving import (CheckpointConfigError, checkpoint_recorded_verifier, checkpoint_speculative_tokens,
                                    vllm_serve_command)


@pytest.mark.parametrize("verifier", ["/data/models/Kimi K2.5 (fp8)", "meta-llama/Llama-3.1-8B-Instruct"])
def test_the_command_names_the_target_and_passes_the_draft_as_speculative_config(verifier):
    command = vllm_serve_command(verifier=verifier, checkpoint_dir="/runs/run-7/checkpoints/2 ü", num_speculative_tokens=5)
    argv = shlex.split(command)
    assert argv[:3] == ["vllm", "serve", verifier]
    assert argv[3] == "--speculative-config"
    assert json.loads(argv[4]) == {"model": "/runs/run-7/checkpoints/2 ü", "method": "eagle3", "num_speculative_tokens": 5}


def test_speculative_tokens_come_from_the_checkpoint_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"proposal_type": "greedy", "speculative_tokens": 4}]}}))
    assert checkpoint_speculative_tokens(tmp_path) == 4
    (tmp_path / "config.json").write_text(json.dumps({"speculators_config": {}}))
    assert checkpoint_speculative_tokens(tmp_path) == 3
    (tmp_path / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"speculative_tokens": "many"}]}}))
    with pytest.raises(CheckpointConfigError, match="speculative_tokens must be an integer"):
        checkpoint_speculative_tokens(tmp_path)


def test_the_recorded_verifier_is_read_for_imports_without_a_local_copy(tmp_path):
    assert checkpoint_recorded_verifier(tmp_path) is None  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"speculators_config": {"verifier": {
        "name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "architectures": ["LlamaForCausalLM"]}}}))
    assert checkpoint_recorded_verifier(tmp_path) == "meta-llama/Llama-3.1-8B-Instruct"
