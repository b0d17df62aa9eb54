"""The evaluate stage on a target spread over several GPUs (num_gpus > 1, as the extraction's device_map):
refused before loading anything on a worker without that many GPUs; with a FAKE spread (this CPU
standing in for cuda:0), the target is loaded for num_gpus and decodes as on one device.

No GPU here: that the hidden states of layers on other GPUs reach the draft on cuda:0
(TargetRunner moves them) is reasoned in workers/stages/evaluate/speculative.py, not run."""
import pytest
import torch

from tests.stages.evaluate.test_evaluate import chat_prompts, inputs, untrained_checkpoint  # noqa: F401 - fixtures
from workers.stages.extract import model as extract_model
from workers.contract.chats.prompt_source import EvaluationInputError
from workers.stages.evaluate.measure import evaluate


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_num_gpus_must_be_a_whole_number_of_at_least_one(tiny_target, tmp_path, bad):
    with pytest.raises(EvaluationInputError, match=r"^num_gpus must be a whole number of at least 1, got "):
        evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=tmp_path, prompts=[[1, 2, 3]],
                 prompt_source="chats", num_gpus=bad)


def test_spreading_over_more_gpus_than_the_worker_has_is_refused_before_loading(tiny_target, tmp_path):
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    asked = max(2, have + 1)
    with pytest.raises(ValueError, match=rf"^num_gpus={asked}: spreading the target needs {asked} CUDA "
                                         rf"devices; this worker has {have}$"):
        evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=tmp_path / "never-read", prompts=[[1, 2, 3]],
                 prompt_source="chats", num_gpus=asked)


def test_a_spread_target_is_loaded_for_num_gpus_and_decodes_as_on_one_device(tiny_target, untrained_checkpoint,
                                                                            chat_prompts, monkeypatch):
    real_load = extract_model.load_target
    loaded: list[int] = []

    def load_on_this_cpu(target_dir, device, num_gpus=1):
        loaded.append(num_gpus)
        return real_load(target_dir, device)  # FAKE: the CPU stands in for the spread over cuda:0..n-1

    monkeypatch.setattr(extract_model, "load_target", load_on_this_cpu)  # evaluate imports it from there as it runs
    monkeypatch.setattr(extract_model, "spread_device", lambda num_gpus: torch.device("cpu"))  # FAKE cuda:0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "FAKE H100")
    common = dict(target_dir=tiny_target.target_dir, checkpoint_dir=untrained_checkpoint, prompts=chat_prompts[:3],
                  prompt_source="demo chats", max_new_tokens=16)
    spread = evaluate(**common, num_gpus=2)
    single = evaluate(**common, device="cpu")  # the one device the FAKE spread stands on, GPUs or not
    assert loaded == [2, 1]
    assert (spread.device, single.device) == ("cuda:0-1 (2 x FAKE H100, device_map=auto)", "cpu")
    assert spread.output_matches_greedy and spread.new_tokens == single.new_tokens
    assert (spread.tau, spread.acceptance_per_position) == (single.tau, single.acceptance_per_position)
