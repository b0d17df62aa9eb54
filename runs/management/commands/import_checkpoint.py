"""Register an EAGLE-3 draft trained elsewhere, after checking that speculators loads it."""
from __future__ import annotations

import json

from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from runs.management.command_user import command_user
from runs.checkpoints.imports import checkpoint_import
from runs.pipeline.status.upstream_commands import checkpoint_serve_command
from workers.contract.errors import InputError


class Command(BaseCommand):
    help = "Import a speculators EAGLE-3 checkpoint directory; idempotent; --verifier relinks it to a local target."

    def add_arguments(self, parser):
        parser.add_argument("directory")
        parser.add_argument("--verifier", default="",
                            help="a local copy of the target the checkpoint was trained for, when the verifier path "
                                 "recorded in its config.json is not on this machine (checked: architecture, layer "
                                 "count, width, vocab)")
        parser.add_argument("--user", default="", help="act as this user (default: the 'cli' launcher account)")
        parser.add_argument("--json", dest="as_json", action="store_true")

    def handle(self, *args, directory: str, verifier: str, as_json: bool, user: str, **opts):
        try:
            ckpt, created = checkpoint_import(path=directory, user=command_user(user), verifier=verifier or None)
        except (InputError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        summary = {"checkpoint_id": ckpt.pk, "created": created, "path": ckpt.path, "epoch": ckpt.epoch,
                   "verifier": ckpt.verifier_path, "aux_layer_ids": ckpt.aux_layer_ids,
                   "draft_vocab_size": ckpt.draft_vocab_size, "vllm_serve": checkpoint_serve_command(ckpt)}
        self.stdout.write(json.dumps(summary) if as_json else f"checkpoint {ckpt.pk}: {ckpt.path}")
