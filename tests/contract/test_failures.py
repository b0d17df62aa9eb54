"""workers.contract.failures against the exceptions the real stages raise on bad inputs: each reads as a
sentence naming what to change, with the right remedy (Retry or a copy with changes) and no traceback."""
import json
import shutil
import socket

import pytest

from workers.contract.failures import (
    INPUTS,
    SETTINGS,
    TRANSIENT,
    UNKNOWN,
    failure_details,
    failure_explain,
    failure_from_text,
    failure_headline,
    trace_for_developers,
)
from workers.stages.prepare.stage import prepare

BANNER = "Traceback (most recent call last)"


def raised(call) -> BaseException:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the exception under test
        return exc
    raise AssertionError("expected the call to fail")


@pytest.fixture(scope="module")
def chats(tiny_target, tmp_path_factory):
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    path.write_text("\n".join(tiny_target.chats_path.read_text().splitlines()[:12]) + "\n")
    return path


def test_target_without_tokenizer_names_the_directory_and_the_target_field(tiny_target, chats, tmp_path):
    target = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_target.target_dir, target)
    for file in target.glob("tokenizer*"):
        file.unlink()
    exc = raised(lambda: prepare(tokenizer_dir=target, dataset_path=chats, out_dir=tmp_path / "out", max_seq_len=256))
    failure = failure_explain(exc, stage_name="prepare", context={"target": str(target)})
    assert failure.sentence == (f"The target's tokenizer could not be loaded from {target}: tokenizer.json is missing "
                                "or unreadable. Pick another target or add the file.")
    assert (failure.kind, failure.field, failure.retryable) == (INPUTS, "target_path", False)


def test_dataset_without_assistant_turn_is_the_datasets_fault(tiny_target, tmp_path):
    dataset = tmp_path / "questions.jsonl"
    dataset.write_text(json.dumps({"messages": [{"role": "user", "content": "hello?"}]}) + "\n")
    exc = raised(lambda: prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=dataset, out_dir=tmp_path / "out",
                                 max_seq_len=256))
    failure = failure_explain(exc, stage_name="prepare")
    assert failure.sentence.startswith("The dataset has no usable conversation: every conversation was excluded, had "
                                       "no assistant turn after the first message")
    assert failure.sentence.endswith("raise max_seq_len if its conversations are longer.")
    assert (failure.kind, failure.field, failure.retryable) == (INPUTS, "dataset_path", False)


def test_max_seq_len_too_small_names_the_setting(tiny_target, chats, tmp_path):
    exc = raised(lambda: prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=chats, out_dir=tmp_path / "o",
                                 max_seq_len=1))
    failure = failure_explain(exc, stage_name="prepare")
    assert failure.sentence == ("The maximum sequence length is refused (max_seq_len must be at least 2, got 1). "
                                "Change max_seq_len.")
    assert (failure.kind, failure.field, failure.retryable) == (SETTINGS, "max_seq_len", False)


def test_layer_id_out_of_range_names_the_layer_ids(tiny_target, chats, tmp_path):
    from workers.stages.extract.with_transformers import extract

    prepared = tmp_path / "prepared"
    prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=chats, out_dir=prepared, max_seq_len=256)
    exc = raised(lambda: extract(target_dir=tiny_target.target_dir, prepared_dir=prepared, out_dir=tmp_path / "x",
                                 layer_ids=[1, 99], num_gpus=0))
    failure = failure_explain(exc, stage_name="extract")
    assert failure.sentence == ("The layer ids are outside this target: layer ids [99] are outside this target: valid "
                                "ids are 0..8 (0 = embeddings, 8 = last hidden state). Change the layer ids.")
    assert (failure.kind, failure.field, failure.retryable) == (SETTINGS, "layer_ids", False)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again on leaving: nothing listens there


def test_a_server_that_does_not_answer_is_retried():
    port = _closed_port()
    exc = raised(lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
    failure = failure_explain(exc, stage_name="train")
    assert failure.sentence.startswith("A server did not answer (") and failure.sentence.endswith("Retry once it is up.")
    assert (failure.kind, failure.retryable) == (TRANSIENT, True)


def test_a_database_away_is_retried():
    import psycopg

    port = _closed_port()
    exc = raised(lambda: psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/x", connect_timeout=2))
    failure = failure_explain(exc, stage_name="vocab")
    assert failure.sentence.startswith("The database was out of reach (")
    assert (failure.kind, failure.retryable) == (TRANSIENT, True)


def test_a_lost_worker_recorded_as_text_is_retried():
    text = ("worker gpu@a stopped renewing its lease (expired 2026-12-06 07:00:00): it was killed, its host went "
            "away, or it lost the database; gave up after 3 attempts")
    failure = failure_from_text(text, stage_name="extract")
    assert failure.sentence == f"The extraction lost its worker ({text}). Nothing in the run is at fault: Retry."
    assert (failure.kind, failure.retryable) == (TRANSIENT, True)


def test_out_of_memory_names_the_packing_budget_and_stays_retryable():
    exc = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)")
    failure = failure_explain(exc, stage_name="train", context={"max_tokens_per_step": 16384})
    assert failure.sentence == ("The GPU ran out of memory during training at a batch of 16,384 tokens: lower "
                                "max_tokens_per_step, or retry when the GPU is less busy.")
    assert (failure.kind, failure.field, failure.retryable) == (TRANSIENT, "max_tokens_per_step", True)


def test_an_unrecognised_failure_reads_as_a_sentence_and_may_be_retried():
    exc = raised(lambda: {}["missing"] + 1)
    failure = failure_explain(exc, stage_name="extract")
    assert failure.sentence == ("The extraction stopped: 'missing'. The full trace is in the stage's details for "
                                "developers.")
    assert (failure.kind, failure.retryable) == (UNKNOWN, True)


def test_any_other_input_error_keeps_its_message_and_guesses_the_field(tiny_target, tmp_path):
    dataset = tmp_path / "broken.jsonl"
    dataset.write_text('{"messages": [}\n')
    exc = raised(lambda: prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=dataset, out_dir=tmp_path / "o",
                                 max_seq_len=256))
    failure = failure_explain(exc, stage_name="prepare")
    assert failure.sentence.startswith(f"The preparation refused its input: {dataset}, line 1")
    assert BANNER not in failure.sentence and (failure.kind, failure.field) == (INPUTS, "dataset_path")


def test_the_trace_for_developers_has_the_frames_and_no_banner():
    def inner():
        raise KeyError("deep")

    def outer():
        try:
            inner()
        except KeyError as exc:
            raise ValueError("wrapped") from exc

    exc = raised(outer)
    trace = trace_for_developers(exc)
    assert BANNER not in trace
    assert "in inner" in trace and "in outer" in trace and trace.rstrip().endswith("ValueError: wrapped")


def test_an_older_rows_stored_traceback_reads_as_its_sentence():
    stored = ("DatasetFormatError: /d/x.jsonl: no training rows: every conversation was excluded\n\n"
              f"{BANNER}:\n  File \"/w/tasks.py\", line 9, in stage_execute\nDatasetFormatError: ...")
    assert failure_headline(stored, stage_name="prepare") == (
        "The dataset has no usable conversation: every conversation was excluded. Pick another dataset, add "
        "assistant replies, or raise max_seq_len if its conversations are longer.")
    details = failure_details(stored, "")
    assert BANNER not in details and 'File "/w/tasks.py", line 9' in details
    assert failure_headline("cancelled by ann", stage_name="prepare") == "cancelled by ann"


def test_every_input_error_the_stages_raise_is_known_by_name():
    """A failure stored as text keeps only its class's name: each InputError subclass must be listed."""
    import importlib
    import pkgutil

    import workers
    from workers.contract.errors import InputError
    from workers.contract.failures import INPUT_ERROR_NAMES

    for module in pkgutil.walk_packages(workers.__path__, "workers."):
        if "vllm_plugins" not in module.name:
            importlib.import_module(module.name)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    names = {cls.__name__ for cls in subclasses(InputError) if cls.__module__.startswith("workers.")}
    assert names and names - INPUT_ERROR_NAMES == set()
