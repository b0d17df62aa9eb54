"""Export a checkpoint as a folder vLLM serves as it is, with a README.md model card (runs.checkpoints.export)."""
from __future__ import annotations

import json

from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from runs.checkpoints.export import checkpoint_export
from runs.management.command_user import command_user
from runs.checkpoints.models import Checkpoint
from workers.contract.errors import InputError


class Command(BaseCommand):
    help = ("Write CHECKPOINT_ID's config.json and weights, and a README.md model card (τ, served speed-up, the "
            "training data's lineage, target and layer ids, the vllm serve command), into the new folder OUT_DIR "
            "under the data roots.")

    def add_arguments(self, parser):
        parser.add_argument("checkpoint_id", type=int)
        parser.add_argument("out_dir", help="a new folder under EAGLE3WEB_DATA_ROOTS")
        parser.add_argument("--user", default="", help="act as this user (default: the 'cli' launcher account)")
        parser.add_argument("--json", dest="as_json", action="store_true")

    def handle(self, *args, checkpoint_id: int, out_dir: str, user: str, as_json: bool, **opts):
        account = command_user(user)
        checkpoint = Checkpoint.objects.select_related("training_run__run__target").filter(pk=checkpoint_id).first()
        if checkpoint is None:
            raise CommandError(f"no checkpoint with id {checkpoint_id}")
        try:
            exported = checkpoint_export(checkpoint=checkpoint, user=account, out_dir=out_dir)
        except (InputError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        if as_json:
            self.stdout.write(json.dumps(exported.as_dict()))
        else:
            self.stdout.write(f"exported checkpoint {checkpoint_id} to {exported.path} ({', '.join(exported.files)}); "
                              f"serve it with:\n{exported.card['serve_command']}")
