"""Import EAGLE-3 drafts trained elsewhere (speculators' checkpoint layout)."""
from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from runs.models import Checkpoint
from runs.paths import check_under_data_roots
from runs.roles import require
from workers.stages.errors import InputError
from workers.stages.jsonfile import read_json_object


class CheckpointError(InputError):
    pass


def checkpoint_import(*, path: str | Path, user: AbstractBaseUser | None = None) -> tuple[Checkpoint, bool]:
    """Register a speculators EAGLE-3 checkpoint directory once it loads with Eagle3DraftModel."""
    if user is not None:
        require(user, "import")
    resolved = check_under_data_roots(path, kind="checkpoint directory")
    existing = Checkpoint.objects.filter(path=str(resolved)).first()
    if existing:
        return existing, False
    config = read_json_object(resolved / "config.json", CheckpointError)
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise CheckpointError(f"{resolved / 'config.json'}: speculators_model_type is {kind!r}, expected 'eagle3'")
    if not (resolved / "model.safetensors").exists():
        raise CheckpointError(f"{resolved}: no model.safetensors")
    from speculators.models.eagle3 import Eagle3DraftModel

    try:
        Eagle3DraftModel.from_pretrained(str(resolved))
    except Exception as exc:  # noqa: BLE001 - whatever speculators says is the user's answer
        raise CheckpointError(f"{resolved}: Eagle3DraftModel.from_pretrained failed: {exc}") from None
    state = read_json_object(resolved / "training_state.json", CheckpointError) if (resolved / "training_state.json").exists() else {}
    val = read_json_object(resolved / "val_metrics.json", CheckpointError) if (resolved / "val_metrics.json").exists() else {}
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    checkpoint = Checkpoint.objects.create(
        training_run=None,
        imported_by=user,
        imported_at=timezone.now(),
        epoch=int(state.get("epoch", resolved.name if resolved.name.isdigit() else 0)),
        path=str(resolved),
        val_loss=val.get("loss_epoch"),
        val_metrics=val,
        verifier_path=str(verifier.get("name_or_path") or ""),
        aux_layer_ids=list(config.get("eagle_aux_hidden_state_layer_ids") or []),
        draft_vocab_size=config.get("draft_vocab_size"),
    )
    return checkpoint, True
