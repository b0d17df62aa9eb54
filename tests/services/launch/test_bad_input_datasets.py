"""Bad-input corpus: chat dataset lines. Each is refused with DatasetFormatError naming file and line;
a line longer than the limit is refused without ever being held in memory whole."""
import json
import tracemalloc

import pytest

from runs.pipeline import services
from runs.models import Dataset, DatasetSample, PipelineRun, TargetModel
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.chats.jsonl import MAX_LINE_BYTES, MAX_TURNS, DatasetFormatError, read_conversations

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def refused(path) -> str:
    with pytest.raises(DatasetFormatError) as err:
        list(read_conversations(path))
    return str(err.value)


def test_a_17_mb_line_is_refused_with_bounded_memory(tmp_path):
    path = tmp_path / "huge.jsonl"
    chunk = "x" * (1024 * 1024)
    with open(path, "w") as fh:
        fh.write(json.dumps(GOOD) + "\n")
        fh.write('{"messages": [{"role": "user", "content": "')
        for _ in range(17):
            fh.write(chunk)
        fh.write('"}]}\n')
    del chunk
    tracemalloc.start()
    try:
        message = refused(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"{path}, line 2: longer than 16 MiB" in message
    assert peak < MAX_LINE_BYTES + 8 * 1024 * 1024, f"held {peak} bytes reading one line"


@pytest.mark.parametrize(
    "line, problem",
    [
        (json.dumps({"messages": [{"role": "user", "content": "x"}] * (MAX_TURNS + 1)}), f"at most {MAX_TURNS}"),
        (json.dumps({"messages": [{"role": ["user"], "content": "x"}]}), "unknown role ['user']"),
        (json.dumps({"messages": [{"role": {"a": 1}, "content": "x"}]}), "unknown role"),
        (json.dumps({"id": "i" * 300, **GOOD}), "'id' must be 1..200 characters"),
        (json.dumps({"id": "a\u0000b", **GOOD}), "'id' holds a NUL character"),
        (json.dumps({"messages": [{"role": "user", "content": "a\u0000b"}]}), "content holds a NUL character"),
        (json.dumps({"messages": [{"role": "user", "content": "\ud800"}]}), "lone surrogate"),
        (json.dumps({"messages": [{"role": "user", "content": {"type": "image"}}]}), "content must be a string"),
        ('{"messages": [], "score": NaN}', "NaN is not a JSON number"),
        ('{"id": ' + "9" * 5000 + ', "messages": []}', "not usable JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
    ],
    ids=["10001-turns", "role-list", "role-dict", "id-300-chars", "id-nul", "content-nul", "content-surrogate",
         "content-object", "nan", "5000-digit-id", "depth-100000"],
)
def test_bad_lines_are_named_by_file_and_line(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n")
    message = refused(path)
    assert f"{path}, line 3" in message and problem in message


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"messages": [{"role": "user", "content": "caf\xe9"}]}\n')
    assert f"{path}, line 2: not UTF-8" in refused(path)


@pytest.mark.django_db
def test_a_bad_dataset_line_stores_nothing_at_launch(tmp_path, user):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 5000}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(GOOD) + "\n" + json.dumps({"id": "i" * 300, **GOOD}) + "\n")
    with pytest.raises(DatasetFormatError, match="line 2: 'id' must be"):
        services.run_launch(user=user, target_path=target, dataset_path=chats, config=RunConfig(), enqueue=False)
    assert (PipelineRun.objects.count(), Dataset.objects.count(), DatasetSample.objects.count(),
            TargetModel.objects.count()) == (0, 0, 0, 0)
