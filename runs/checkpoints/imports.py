"""Import EAGLE-3 drafts trained elsewhere (speculators' checkpoint layout)."""
from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from runs.checkpoints.models import Checkpoint
from runs.data.paths import check_under_data_roots
from runs.roles import require
from runs.pipeline.status.upstream_commands import recorded_speculative_tokens
from workers.contract.errors import InputError
from workers.contract.inputs.jsonfile import read_json_object
from workers.contract.inputs.regular_file import special_entries
from workers.contract.target import read_target_config, read_target_json

PASS_VERIFIER = ("pass --verifier PATH naming a local copy of the target it was trained for "
                 "(`manage.py import_checkpoint DIR --verifier PATH`)")


class CheckpointError(InputError):
    pass


def _recorded_verifier(config: dict) -> dict:
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    return verifier if isinstance(verifier, dict) else {}


def verifier_mismatches(*, config: dict, config_path: Path, verifier_dir: Path) -> list[str]:
    """What a local verifier disagrees on with the one a checkpoint was trained for, each naming its field.

    speculators records the verifier's `architectures` (VerifierConfig.from_pretrained,
    speculators/config.py:79-98) and copies its `vocab_size` and `hidden_size` into
    `transformer_layer_config` (train/cli.py create_transformer_layer_config:215-217);
    `target_hidden_size` overrides the width when the draft's differs. The verifier's layer count
    is not recorded: `eagle_aux_hidden_state_layer_ids` are indices of its decoder layers, so
    they must lie below the local count, and ids that are speculators' default [2, N//2, N-3]
    (resolve_target_layer_ids) name N itself."""
    local = read_target_config(verifier_dir)
    local_arch = read_target_json(verifier_dir).get("architectures") or [local.architecture]
    where = f"{config_path} records"
    found = []
    recorded_arch = _recorded_verifier(config).get("architectures") or []
    if recorded_arch and list(recorded_arch) != list(local_arch):
        found.append(f"architecture: {where} speculators_config.verifier.architectures {recorded_arch}, "
                     f"{verifier_dir} has {local_arch}")
    layer = config.get("transformer_layer_config") or {}
    width_field = "target_hidden_size" if config.get("target_hidden_size") else "transformer_layer_config.hidden_size"
    width = config.get("target_hidden_size") or layer.get("hidden_size")
    if width is not None and width != local.hidden_size:
        found.append(f"hidden width: {where} {width_field} {width}, {verifier_dir} has hidden_size {local.hidden_size}")
    vocab = layer.get("vocab_size")
    if vocab is not None and vocab != local.vocab_size:
        found.append(f"vocab: {where} transformer_layer_config.vocab_size {vocab}, {verifier_dir} has vocab_size "
                     f"{local.vocab_size}")
    ids = config.get("eagle_aux_hidden_state_layer_ids") or []
    n = local.num_layers
    if ids and max(ids) >= n:
        found.append(f"layer count: {where} eagle_aux_hidden_state_layer_ids {ids}, but {verifier_dir} has "
                     f"{n} layers (ids must be below {n})")
    elif len(ids) == 3 and ids[0] == 2 and ids[2] >= 5 and ids[1] == (ids[2] + 3) // 2 and ids[2] + 3 != n:
        found.append(f"layer count: {where} eagle_aux_hidden_state_layer_ids {ids}, speculators' default "
                     f"[2, N//2, N-3] for a {ids[2] + 3}-layer verifier; {verifier_dir} has {n} layers")
    return found


def _load_draft(resolved: Path, verifier: str) -> None:
    """Eagle3DraftModel.from_pretrained with the verifier's weights read from `verifier`."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    spec_config = Eagle3SpeculatorConfig.from_pretrained(str(resolved))
    spec_config.speculators_config.verifier.name_or_path = verifier
    Eagle3DraftModel.from_pretrained(str(resolved), config=spec_config)


def checkpoint_check(*, resolved: Path, local_verifier: Path | None) -> tuple[dict, str]:
    """What import_checkpoint checks of a checkpoint directory (already under the data roots): a
    speculators eagle3 config.json, its weights, a verifier it agrees with (`local_verifier`, else the one
    it records), and that Eagle3DraftModel loads it. Returns its config and the verifier to serve it with;
    CheckpointError naming the problem otherwise."""
    odd = special_entries(resolved)
    if odd:  # speculators' loader would open them and wait forever on a FIFO
        raise CheckpointError(f"{resolved}: {'; '.join(odd)}: a checkpoint holds regular files only")
    config_path = resolved / "config.json"
    config = read_json_object(config_path, CheckpointError)
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise CheckpointError(f"{config_path}: speculators_model_type is {kind!r}, expected 'eagle3'")
    if not (resolved / "model.safetensors").exists():
        raise CheckpointError(f"{resolved}: no model.safetensors")
    recorded = str(_recorded_verifier(config).get("name_or_path") or "")
    if local_verifier is not None:
        mismatches = verifier_mismatches(config=config, config_path=config_path, verifier_dir=local_verifier)
        if mismatches:
            raise CheckpointError(f"{local_verifier} is not the verifier {resolved} was trained for: "
                                  + "; ".join(mismatches))
        verifier_path = str(local_verifier)
    else:
        looks_local = recorded.startswith(("/", ".", "~")) or Path(recorded).exists()
        if not recorded or (looks_local and not Path(recorded).is_dir()):
            shown = f"verifier {recorded!r}" if recorded else "no verifier"
            raise CheckpointError(f"{config_path} records {shown} (speculators_config.verifier.name_or_path), "
                                  f"which is not a directory on this machine; {PASS_VERIFIER}")
        verifier_path = recorded
    if Path(verifier_path).is_dir() and special_entries(verifier_path):
        raise CheckpointError(f"verifier {verifier_path}: {'; '.join(special_entries(verifier_path))}: "
                              "a model directory holds regular files only")
    try:
        _load_draft(resolved, verifier_path)
    except Exception as exc:  # noqa: BLE001 - whatever speculators says is the user's answer
        hint = "" if local_verifier is not None else f"; if the verifier {verifier_path!r} is not available here, {PASS_VERIFIER}"
        raise CheckpointError(f"{resolved}: Eagle3DraftModel.from_pretrained failed: {exc}{hint}") from None
    return config, verifier_path


def checkpoint_records(resolved: Path) -> tuple[dict, dict]:
    """The training state and validation metrics a speculators checkpoint directory holds ({} when absent)."""
    state = read_json_object(resolved / "training_state.json", CheckpointError) if (resolved / "training_state.json").exists() else {}
    val = read_json_object(resolved / "val_metrics.json", CheckpointError) if (resolved / "val_metrics.json").exists() else {}
    return state, val


def checkpoint_import(*, path: str | Path, user: AbstractBaseUser | None = None,
                      verifier: str | Path | None = None) -> tuple[Checkpoint, bool]:
    """Register a speculators EAGLE-3 checkpoint directory once it loads with Eagle3DraftModel.

    `verifier` relinks a checkpoint trained on another machine to a local copy of its target:
    it must agree with the recorded verifier on architecture, layer count, width and vocab, and
    becomes `Checkpoint.verifier_path`. The checkpoint's own files are left as they are."""
    if user is not None:
        require(user, "import")
    resolved = check_under_data_roots(path, kind="checkpoint directory")
    local_verifier = check_under_data_roots(verifier, kind="verifier directory") if verifier else None
    existing = Checkpoint.objects.filter(path=str(resolved)).first()
    if existing and (local_verifier is None or existing.verifier_path == str(local_verifier)):
        return existing, False
    if existing and existing.training_run_id is not None:
        raise CheckpointError(f"{resolved}: checkpoint {existing.pk} was trained by run "
                              f"{existing.training_run_id} here; its verifier is that run's target and is not relinked")
    config, verifier_path = checkpoint_check(resolved=resolved, local_verifier=local_verifier)
    if existing:  # an import relinked to another local copy of its target
        existing.verifier_path = verifier_path
        existing.save(update_fields=["verifier_path"])
        return existing, False
    state, val = checkpoint_records(resolved)
    checkpoint = Checkpoint.objects.create(
        training_run=None,
        imported_by=user,
        imported_at=timezone.now(),
        epoch=int(state.get("epoch", resolved.name if resolved.name.isdigit() else 0)),
        path=str(resolved),
        val_loss=val.get("loss_epoch"),
        val_metrics=val,
        verifier_path=verifier_path,
        aux_layer_ids=list(config.get("eagle_aux_hidden_state_layer_ids") or []),
        draft_vocab_size=config.get("draft_vocab_size"),
        speculative_tokens=recorded_speculative_tokens(resolved),
    )
    return checkpoint, True
