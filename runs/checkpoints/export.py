"""Exporting a checkpoint: a folder vLLM serves as it is, with a README.md model card (issue 39).

The output folder is a path under the data roots (runs.data.paths), never one a user names outside them;
without one, a new folder under <EAGLE3WEB_RUNS_DIR>/exports/. It must not exist yet: an export never
writes into, or over, a folder. The copy is made in this process (the page's button, the API, the command
wait for it): a draft's served files are its config and weights, hundreds of MB for large targets, seconds
to copy on a local disk."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from runs.checkpoints.card_facts import checkpoint_card_facts
from runs.data.paths import check_under_data_roots
from runs.checkpoints.models import Checkpoint
from runs.roles import require
from workers.contract.checkpoints.export import ExportError, export_folder
from workers.contract.errors import InputError
from workers.contract.checkpoints.model_card import model_card_markdown


@dataclass(frozen=True)
class CheckpointExport:
    checkpoint_id: int
    path: Path
    files: list[str]
    bytes: int
    card: dict  # the facts the card states (also in its front matter)

    def as_dict(self) -> dict:
        return {"checkpoint_id": self.checkpoint_id, "path": str(self.path), "files": self.files,
                "bytes": self.bytes, "card": self.card, "serve_command": self.card["serve_command"]}


def _out_dir_error(message: str) -> ExportError:
    error = ExportError(message)
    error.field = "out_dir"  # the API names the field (runs.api.base.api_exception_handler)
    return error


def default_export_dir(checkpoint: Checkpoint) -> Path:
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    return Path(settings.EAGLE3WEB_RUNS_DIR) / "exports" / f"checkpoint-{checkpoint.pk}-epoch-{checkpoint.epoch + 1}-{stamp}"


def checkpoint_export(*, checkpoint: Checkpoint, user: AbstractBaseUser | None, out_dir: str | Path | None = None,
                      ) -> CheckpointExport:
    """Write the checkpoint's served files and its card into a new folder under the data roots."""
    if user is not None:
        require(user, "launch")
    raw = str(out_dir).strip() if out_dir is not None and str(out_dir).strip() else str(default_export_dir(checkpoint))
    try:
        target = check_under_data_roots(raw, must_exist=False, kind="the output folder")
    except InputError as exc:
        raise _out_dir_error(str(exc)) from None
    source = check_under_data_roots(checkpoint.path, kind="the checkpoint's folder")
    if target == source or target.is_relative_to(source):
        raise _out_dir_error(f"the output folder {target} lies inside the checkpoint's folder; name another")
    if target.exists() or target.is_symlink():
        raise _out_dir_error(f"the output folder {target} already exists: name a new folder (an export never writes "
                             "into one, so nothing there is overwritten)")
    facts = checkpoint_card_facts(checkpoint=checkpoint, out_dir=target)
    try:
        written = export_folder(checkpoint_dir=source, out_dir=target, card_text=model_card_markdown(facts))
    except OSError as exc:
        raise ExportError(f"could not write {target}: {exc.strerror or exc}; nothing was left there") from None
    return CheckpointExport(checkpoint_id=checkpoint.pk, path=written.path, files=written.files, bytes=written.bytes,
                            card=facts)
