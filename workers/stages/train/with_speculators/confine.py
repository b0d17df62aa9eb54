"""speculators' online trainer, kept to its capture server's staging folder (issue 34).

speculators 0.9 reads the hidden-states file at whatever path its endpoint answers with and then deletes
it (hs_connectors/transfer.py FileTransfer.get_generated and delete: `load_file(Path(handle))`,
`Path(handle).unlink()`), in the trainer's own process, where a capture server given by URL could name any
file the worker may read or remove. The entry module (with_speculators.entry) installs this before the
trainer starts when the train stage asks for it (CONFINE_ENV): FileTransfer then takes the file the way our
own online loop does (workers.stages.train.online.staging.take_sample: under the staging folder, no
symlink, moved into the run's own folder first), reads that and removes only that; its delete removes
nothing the server named. Its OpenAI client follows no redirect. A refused path raises CaptureRefused in
speculators' round trip, which it retries and then fails on, naming the server.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

CONFINE_ENV = "EAGLE3WEB_CAPTURE_CONFINE"  # JSON: {"staging": folder, "taken": folder, "server": url}


def confine_spec(*, staging: Path, taken: Path, server: str) -> str:
    return json.dumps({"staging": str(staging), "taken": str(taken), "server": server})


def install(spec: str) -> None:
    import openai
    from hs_connectors import transfer
    from safetensors.torch import load_file
    from speculators.train import data

    from workers.stages.extract.with_vllm import LOCK_TIMEOUT_S
    from workers.stages.train.online.staging import take_sample

    where = json.loads(spec)
    staging, taken, server = Path(where["staging"]), Path(where["taken"]), str(where["server"])

    def get_generated(self, hs_transfer_params):
        handle = hs_transfer_params.get("hidden_states_path") or hs_transfer_params.get("handle")
        path = take_sample(handle, staging=staging, taken_dir=taken, server=server, lock_timeout_s=LOCK_TIMEOUT_S)
        try:
            return load_file(str(path))
        finally:
            path.unlink(missing_ok=True)

    def delete(self, handle):
        """Nothing: get_generated took the file out of the staging folder and removed its own copy."""

    transfer.FileTransfer.get_generated = get_generated
    transfer.FileTransfer.delete = delete

    class NoRedirects:
        """speculators' `openai` as its dataset uses it, but a client that follows no redirect."""

        def __getattr__(self, name):
            return getattr(openai, name)

        @staticmethod
        def OpenAI(**kwargs):  # noqa: N802 - openai's own name
            return openai.OpenAI(http_client=openai.DefaultHttpxClient(follow_redirects=False), **kwargs)

    data.openai = NoRedirects()


def install_from_environment() -> None:
    spec = os.environ.get(CONFINE_ENV)
    if spec:
        install(spec)
