"""Measure a checkpoint's acceptance length by speculative decoding, in this process."""
from __future__ import annotations

import json
from pathlib import Path

from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from runs.pipeline.status.run_summary import evaluation_dict
from runs.checkpoints.imports import checkpoint_import
from runs.checkpoints.evaluation import evaluation_request
from runs.management.command_user import command_user
from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.lifecycle.stage_record import StageStatus
from workers.contract.errors import InputError


def checkpoint_from_ref(ref: str, account) -> Checkpoint:
    """A checkpoint by id, or by directory (imported when it is not registered yet)."""
    if ref.isdigit():
        try:
            return Checkpoint.objects.select_related("training_run__run__target").get(pk=int(ref))
        except Checkpoint.DoesNotExist:
            raise CommandError(f"no checkpoint with id {ref}") from None
    found = Checkpoint.objects.filter(path=str(Path(ref).resolve())).first()
    return found or checkpoint_import(path=ref, user=account)[0]


class Command(BaseCommand):
    help = ("Decode held-out prompts with the target alone and with the draft; print tau (tokens per target "
            "forward), acceptance per draft position and whether the output equals greedy decoding.")

    def add_arguments(self, parser):
        parser.add_argument("checkpoint", help="a checkpoint id, or a speculators checkpoint directory (imported if new)")
        parser.add_argument("--prompts", default=None,
                            help="chat JSONL (ShareGPT or OpenAI messages); default: the run's validation conversations")
        parser.add_argument("--max-new-tokens", type=int, default=64)
        parser.add_argument("--max-prompts", type=int, default=32)
        parser.add_argument("--num-speculative-tokens", type=int, default=None, help="k; default: the checkpoint's own")
        parser.add_argument("--user", default="", help="act as this user (default: the 'cli' launcher account)")
        parser.add_argument("--json", dest="as_json", action="store_true")

    def handle(self, *args, checkpoint: str, as_json: bool, user: str, **opts):
        from workers.orchestration.tasks import stage_execute

        account = command_user(user)
        try:
            ckpt = checkpoint_from_ref(checkpoint, account)
            evaluation, _ = evaluation_request(
                checkpoint=ckpt, user=account, prompts_path=opts["prompts"], max_new_tokens=opts["max_new_tokens"],
                max_prompts=opts["max_prompts"], num_speculative_tokens=opts["num_speculative_tokens"], enqueue=False)
        except (InputError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        # A pending one with these settings is returned instead of a new one: a queued one runs here (its
        # worker then skips it), a running one is its worker's.
        if evaluation.status == StageStatus.RUNNING:
            raise CommandError(f"evaluation {evaluation.pk} of checkpoint {ckpt.pk} with these settings is already "
                               f"running on {evaluation.worker or 'a worker'}; its result appears on the checkpoint's "
                               "page when it finishes")
        stage_execute(stage_name="evaluate", record_id=evaluation.pk, worker="cli")
        evaluation = Evaluation.objects.select_related("checkpoint").get(pk=evaluation.pk)
        summary = {"evaluation_id": evaluation.pk, "checkpoint_path": ckpt.path,
                   **evaluation_dict(evaluation, ckpt.simulated_tau), "error": evaluation.error}
        if as_json:
            self.stdout.write(json.dumps(summary))
        elif evaluation.status == StageStatus.SUCCEEDED:
            self.stdout.write(f"checkpoint {ckpt.pk}: tau {evaluation.tau:.3f} over {evaluation.num_prompts} prompts, "
                              f"acceptance per position {[round(p, 3) for p in evaluation.acceptance_per_position]}, "
                              f"output equals greedy: {evaluation.output_matches_greedy}")
        if evaluation.status != StageStatus.SUCCEEDED:
            raise CommandError(f"evaluation {evaluation.pk} {evaluation.status}: {evaluation.error.splitlines()[0] if evaluation.error else ''}")
        if not evaluation.output_matches_greedy:
            raise CommandError(f"evaluation {evaluation.pk}: the draft changed the output on prompts "
                               f"{evaluation.mismatched_prompts}; speculative decoding must equal greedy decoding")
