"""Regenerate a dataset's replies with a target (on-policy data), as the dataset page's Regenerate does."""
from __future__ import annotations

import json
import time

from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from runs.data.regeneration import BACKEND_CHOICES, RegenerationSettings, dataset_regenerate_request
from runs.data.regeneration_selectors import regeneration_dict
from runs.management.command_user import command_user
from runs.roles import require
from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES, StageStatus
from runs.pipeline import services
from runs.pipeline.jobs.models import DatasetRegeneration
from workers.contract.errors import InputError


class Command(BaseCommand):
    help = ("Answer every user turn of a chat dataset again with the target, given the regenerated history before "
            "it (system turns kept), into a new dataset under the data root whose lineage names this one. Asking "
            "again with the same settings returns the same dataset; a failed or cancelled one resumes.")

    def add_arguments(self, parser):
        parser.add_argument("--target", required=True, help="the target model's directory (its tokenizer and chat template)")
        parser.add_argument("--dataset", required=True, help="chat JSONL (ShareGPT or OpenAI messages)")
        parser.add_argument("--max-new-tokens", type=int, default=512, help="per reply; a reply cut there is counted")
        parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
        parser.add_argument("--max-samples", type=int, default=None, help="the first N conversations not excluded")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                            help="vllm (its chat endpoint), transformers (generate), or auto: vLLM where it runs")
        parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs vLLM spreads the target over")
        parser.add_argument("--shards", type=int, default=None,
                            help="workers that share its conversations at once (default: one per live worker)")
        parser.add_argument("--user", default="", help="act as this user (default: the 'cli' launcher account)")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--inline", action="store_true", help="regenerate in this process")
        mode.add_argument("--wait", action="store_true", help="queue it, then wait for a worker to finish it")
        parser.add_argument("--timeout", type=float, default=24 * 3600, help="seconds --wait waits at most")
        parser.add_argument("--json", dest="as_json", action="store_true", help="print the summary as one JSON line")

    def _refuse(self, message: str, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps({"error": message}))
        raise CommandError(message)

    def handle(self, *args, as_json: bool, **opts):
        from django.db import transaction

        user = command_user(opts["user"])
        try:
            require(user, "launch")  # before the target and dataset are registered: a refusal stores nothing
            with transaction.atomic():
                target = services.target_register(path=opts["target"])
                dataset = services.dataset_register(path=opts["dataset"])
            settings = RegenerationSettings(
                backend=opts["backend"], max_new_tokens=opts["max_new_tokens"], temperature=opts["temperature"],
                seed=opts["seed"], max_samples=opts["max_samples"], tensor_parallel_size=opts["tensor_parallel_size"],
                shards=opts["shards"])
            job, _ = dataset_regenerate_request(dataset=dataset, target=target, settings=settings, user=user,
                                                where="this_host" if opts["inline"] else "fleet",
                                                enqueue=not opts["inline"])
        except (InputError, PermissionDenied) as exc:
            self._refuse(str(exc), as_json)
        if opts["inline"]:
            if job.status == StageStatus.RUNNING:
                self._refuse(f"regeneration {job.pk} is already running on {job.worker or 'a worker'}; "
                             "its dataset appears on the source dataset's page", as_json)
            if job.status == StageStatus.QUEUED:
                from workers.orchestration.tasks import stage_execute

                stage_execute(stage_name="regenerate", record_id=job.pk, worker="cli")
        elif opts["wait"]:
            deadline = time.monotonic() + opts["timeout"]
            while time.monotonic() < deadline and DatasetRegeneration.objects.filter(
                    pk=job.pk).exclude(status__in=FINISHED_STATUSES).exists():
                time.sleep(1.0)
        job = DatasetRegeneration.objects.select_related("target", "source", "requested_by").get(pk=job.pk)
        summary = {"regeneration_id": job.pk, "status": job.status, "dataset_id": job.dataset_id,
                   "path": job.output_path if job.dataset_id else None,
                   "regenerated_from": regeneration_dict(job),
                   **{k: getattr(job, k) for k in ("conversations", "turns_regenerated", "replies_cut", "failures")},
                   "error": job.error.splitlines()[0] if job.error else None}
        if as_json:
            self.stdout.write(json.dumps(summary))
        else:
            self.stdout.write(f"regeneration {job.pk}: {job.status} ({job.backend})")
            if job.dataset_id:
                self.stdout.write(f"  dataset {job.dataset_id}: {job.output_path}")
                self.stdout.write(f"  {job.conversations} conversations, {job.turns_regenerated} replies regenerated, "
                                  f"{job.replies_cut} cut at --max-new-tokens, {job.failures} failures")
        if job.status in (StageStatus.FAILED, StageStatus.CANCELLED):
            raise CommandError(f"regeneration {job.pk} {job.status}: {job.error[:4000]}")
        if (opts["inline"] or opts["wait"]) and job.status != StageStatus.SUCCEEDED:
            raise CommandError(f"regeneration {job.pk} is still {job.status} after {opts['timeout']:.0f} s")
