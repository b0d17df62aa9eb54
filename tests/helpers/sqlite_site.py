"""The rows of tests/e2e/faults/test_sqlite_writers.py, written by a process of their own on the test's
SQLite file (DATABASE_URL), beside the workers and the web server that use the same file:

    DATABASE_URL=sqlite:///DB python -m tests.helpers.sqlite_site ROOT CHATS EXTRACTIONS

makes a superuser, EXTRACTIONS small imported extractions (verified once here) and a chat file of
CHATS conversations under ROOT, registers it (which queues its catalogue for a worker), and prints
{"password", "extractions": [ids], "dataset", "catalogue"} as JSON."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402

from runs.data.extractions import extraction_import  # noqa: E402
from runs.pipeline import services  # noqa: E402
from tests.contract.test_verify import N, H, write_flat  # noqa: E402

PASSWORD = "pw-sqlite-writer-1"
CHAT = {"messages": [{"role": "user", "content": "how do locks work?"},
                     {"role": "assistant", "content": "one writer " * 20}]}


def chat_file(path: Path, *, rows: int) -> Path:
    with path.open("w") as out:
        for i in range(rows):
            out.write(json.dumps({"id": f"c{i}", **CHAT}) + "\n")
    return path


def main(root: Path, chats: int, extractions: int) -> dict:
    get_user_model().objects.create_superuser("writer", password=PASSWORD)
    target = root / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "num_hidden_layers": N, "hidden_size": H, "vocab_size": 1000}))
    ids = [extraction_import(path=write_flat(root / f"extraction-{i}"), target_path=target)[0].pk
           for i in range(extractions)]
    dataset = services.dataset_register(path=chat_file(root / "chats.jsonl", rows=chats))
    return {"password": PASSWORD, "extractions": ids, "dataset": dataset.pk,
            "catalogue": dataset.catalogues.get().pk}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))))
