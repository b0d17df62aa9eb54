"""Serve a checkpoint with vLLM itself and compare vLLM's acceptance length with ours, in this process."""
from __future__ import annotations

import json

from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from runs.checkpoints.evaluation import evaluation_request
from runs.pipeline.jobs.models import ServeCheck
from runs.management.command_user import command_user
from runs.management.commands.evaluate_checkpoint import checkpoint_from_ref
from runs.checkpoints.models import Evaluation
from runs.pipeline.launch.setting_checks import parse_serve_concurrency
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.checkpoints.serve_check_selectors import serve_check_dict, serve_check_line
from runs.checkpoints.serve_check_services import serve_check_request
from workers.contract.errors import InputError


class Command(BaseCommand):
    help = ("Measure the draft's tau with our decoding (the same as evaluate_checkpoint), then serve the target "
            "with the draft in vLLM (the checkpoint page's vllm serve line) and alone, on the same prompts: "
            "vLLM's tau from its counters, whether its output stays the target's, tokens/s with and without.")

    def add_arguments(self, parser):
        parser.add_argument("checkpoint", help="a checkpoint id, or a speculators checkpoint directory (imported if new)")
        parser.add_argument("--prompts", default=None,
                            help="chat JSONL (ShareGPT or OpenAI messages); default: the run's validation conversations")
        parser.add_argument("--max-new-tokens", type=int, default=64)
        parser.add_argument("--max-prompts", type=int, default=32)
        parser.add_argument("--concurrency", default="", metavar="N,N,...",
                            help="concurrent requests of each load level, 1 to 256 (default: the run's "
                            "serve_concurrency, else 1,8,32): output tokens/s with the draft and without at each")
        parser.add_argument("--user", default="", help="act as this user (default: the 'cli' launcher account)")
        parser.add_argument("--json", dest="as_json", action="store_true")

    def handle(self, *args, checkpoint: str, as_json: bool, user: str, **opts):
        from workers.orchestration.tasks import stage_execute

        account = command_user(user)
        try:
            concurrency = parse_serve_concurrency(opts["concurrency"]) if opts["concurrency"] else None
        except InputError as exc:
            raise CommandError(f"--concurrency: {exc}") from None
        try:
            ckpt = checkpoint_from_ref(checkpoint, account)
            evaluation, _ = evaluation_request(checkpoint=ckpt, user=account, prompts_path=opts["prompts"],
                                               max_new_tokens=opts["max_new_tokens"], max_prompts=opts["max_prompts"],
                                               enqueue=False)
        except (InputError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        if evaluation.status == StageStatus.QUEUED:
            stage_execute(stage_name="evaluate", record_id=evaluation.pk, worker="cli")
        evaluation = Evaluation.objects.get(pk=evaluation.pk)
        if evaluation.status != StageStatus.SUCCEEDED:
            raise CommandError(f"measuring our tau first: evaluation {evaluation.pk} {evaluation.status}: "
                               f"{evaluation.error.splitlines()[0] if evaluation.error else 'it is not finished'}")
        try:
            check, _ = serve_check_request(checkpoint=ckpt, user=account, evaluation=evaluation, enqueue=False,
                                           concurrency=concurrency)
        except (InputError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        if check.status == StageStatus.RUNNING:
            raise CommandError(f"serve check {check.pk} of checkpoint {ckpt.pk} is already running on "
                               f"{check.worker or 'a worker'}; its result appears on the checkpoint's page")
        stage_execute(stage_name="serve_check", record_id=check.pk, worker="cli")
        check = ServeCheck.objects.get(pk=check.pk)
        summary = {"checkpoint_id": ckpt.pk, "checkpoint_path": ckpt.path, "evaluation_id": evaluation.pk,
                   **serve_check_dict(check)}
        if as_json:
            self.stdout.write(json.dumps(summary))
        elif check.status == StageStatus.SUCCEEDED:
            self.stdout.write(serve_check_line(check))
        if check.status != StageStatus.SUCCEEDED:
            raise CommandError(f"serve check {check.pk} {check.status}: {check.error[:4000]}")
        if check.disagrees:
            self.stderr.write(f"warning: {serve_check_line(check)}")
        if not check.vllm_output_matches_greedy:
            raise CommandError(f"serve check {check.pk}: vLLM's output with the draft differed from the target's alone "
                               f"on prompts {check.mismatched_prompts}; this draft must not be deployed")
