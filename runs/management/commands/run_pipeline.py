"""Launch exactly what the browser's launch form launches, from a shell."""
from __future__ import annotations

import argparse
import json
import time

from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from runs.pipeline import selectors, services
from runs.pipeline.status.run_status import run_is_finished
from runs.pipeline.status.run_summary import run_summary
from runs.management.command_user import command_user
from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.launch.capture_urls import check_capture_urls
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import (BEST_BY, HELD_OUT, HIDDEN_STATES, MAX_CAPTURE_SERVERS,
                                                 RENAMED_SETTINGS, RunConfigError, renamed_setting)
from runs.pipeline.launch.setting_checks import parse_layer_ids, parse_pairs, parse_serve_concurrency, parse_weights
from workers.contract.host.backends import EXTRACTION_BACKENDS, TRAINING_BACKENDS
from workers.contract.errors import InputError


# The flags of the settings whose errors are worded in flag words here (RunConfigError.field -> flag).
FLAGS = {"hidden_states": "--hidden-states", "capture_urls": "--capture-url", "capture_servers": "--capture-servers",
         "hidden_states_cache_gib": "--hidden-states-cache-gib", "shards": "--shards", "eval_suites": "--eval-suite",
         "best_suite": "--best-suite", "best_suite_weights": "--best-suite-weight",
         "serve_concurrency": "--serve-concurrency"}


def in_flag_words(exc: RunConfigError) -> str:
    """"--capture-servers: capture_servers must be ..." for a setting that FLAGS names; the message as it is else."""
    flag = FLAGS.get(getattr(exc, "field", None) or "")
    return f"{flag}: {exc}" if flag and not str(exc).startswith(flag) else str(exc)


def run_config_from(opts: dict) -> RunConfig:
    """The run's settings from the options below (launch_sweep takes the same options)."""
    try:
        return _run_config_from(opts)
    except RunConfigError as exc:
        raise RunConfigError(in_flag_words(exc), field=exc.field) from None


def _run_config_from(opts: dict) -> RunConfig:
    for old in RENAMED_SETTINGS:
        if opts.get(old) is not None:
            raise RunConfigError(renamed_setting(old, named=lambda name: "--" + name.replace("_", "-")))
    return RunConfig(
        layer_ids=parse_layer_ids(opts["layer_ids"]),
        max_seq_len=opts["max_seq_len"],
        max_samples=opts["max_samples"],
        draft_vocab_size=opts["draft_vocab_size"],
        epochs=opts["epochs"],
        lr=opts["lr"],
        ttt_steps=opts["ttt_steps"],
        max_tokens_per_step=opts["max_tokens_per_step"],
        val_fraction=opts["val_fraction"],
        seed=opts["seed"],
        eval_prompts=opts["eval_prompts"],
        eval_max_new_tokens=opts["eval_max_new_tokens"],
        extraction_backend=opts["extraction_backend"],
        tensor_parallel_size=opts["tensor_parallel_size"],
        training_backend=opts["training_backend"],
        train_gpus=opts["train_gpus"],
        train_nodes=opts["train_nodes"],
        serve_check=opts["serve_check"],
        serve_concurrency=parse_serve_concurrency(opts.get("serve_concurrency") or ""),
        best_by=opts["best_by"],
        live_tau=opts["live_tau"],
        stop_when_tau_flat=opts["stop_when_tau_flat"],
        hidden_states=opts["hidden_states"],
        capture_urls=check_capture_urls(opts["capture_urls"], named="--capture-url {}"),
        capture_servers=opts["capture_servers"],
        hidden_states_cache_gib=opts["hidden_states_cache_gib"],
        shards=opts.get("shards"),
        eval_suites=parse_pairs(opts.get("eval_suites") or [], field_name="eval_suites", named="--eval-suite"),
        best_suite=opts.get("best_suite") or HELD_OUT,
        best_suite_weights=parse_weights(opts.get("best_suite_weights") or [], named="--best-suite-weight"),
    )


class Command(BaseCommand):
    help = "Launch a pipeline run (prepare, extract, vocab, train, evaluate) and print a JSON summary."

    def add_arguments(self, parser):
        parser.add_argument("--target", required=True, help="target model directory (under EAGLE3WEB_DATA_ROOTS)")
        parser.add_argument("--dataset", required=True, help="chat JSONL file (under EAGLE3WEB_DATA_ROOTS)")
        parser.add_argument("--layer-ids", default="", help="comma-separated hidden-state ids; default EAGLE-3's")
        parser.add_argument("--max-seq-len", type=int, default=RunConfig.max_seq_len)
        parser.add_argument("--max-samples", type=int, default=None,
                            help="training rows from the dataset's start, one per assistant reply (speculators' samples)")
        parser.add_argument("--draft-vocab-size", type=int, default=RunConfig.draft_vocab_size)
        parser.add_argument("--epochs", type=int, default=RunConfig.epochs)
        parser.add_argument("--lr", type=float, default=RunConfig.lr)
        parser.add_argument("--ttt-steps", type=int, default=RunConfig.ttt_steps)
        parser.add_argument("--max-tokens-per-step", type=int, default=None,
                            help="training packing budget; raised to the longest row (default: 512 or the longest)")
        parser.add_argument("--val-fraction", type=float, default=RunConfig.val_fraction,
                            help="share of rows held out for validation, whole conversations at a time")
        parser.add_argument("--seed", type=int, default=RunConfig.seed, help="split and initialisation seed")
        parser.add_argument("--eval-prompts", type=int, default=RunConfig.eval_prompts,
                            help="held-out conversations decoded to measure acceptance length")
        parser.add_argument("--eval-max-new-tokens", type=int, default=RunConfig.eval_max_new_tokens)
        parser.add_argument("--extraction-backend", default=RunConfig.extraction_backend,
                            help=f"{' or '.join(EXTRACTION_BACKENDS)} (default %(default)s); see /workers/ for what "
                            "the live workers can run (with --inline: what this host can run)")
        parser.add_argument("--tensor-parallel-size", type=int, default=RunConfig.tensor_parallel_size,
                            help="GPUs for extraction: vLLM's tensor-parallel size, or how many GPUs transformers "
                            "spreads the target over")
        parser.add_argument("--training-backend", default=RunConfig.training_backend,
                            help=f"{' or '.join(TRAINING_BACKENDS)} (default %(default)s)")
        parser.add_argument("--train-gpus", type=int, default=RunConfig.train_gpus,
                            help="GPUs for training (torchrun processes for speculators; eagle3web uses one)")
        parser.add_argument("--train-nodes", type=int, default=RunConfig.train_nodes,
                            help="worker hosts the training spans, one torchrun rank each (default %(default)s)")
        parser.add_argument("--serve-check", action="store_true",
                            help="after measuring acceptance, serve the best checkpoint with vLLM on the same prompts")
        parser.add_argument("--serve-concurrency", default="", metavar="N,N,...",
                            help="the serve check's load: concurrent requests of each level, 1 to 256 "
                            "(default 1,8,32); output tokens/s with the draft and without at each")
        parser.add_argument("--live-tau", action="store_true",
                            help="measure each checkpoint on the evaluate queue as soon as it is saved")
        parser.add_argument("--stop-when-tau-flat", type=int, default=None, metavar="PATIENCE",
                            help="stop training once PATIENCE measured checkpoints in a row did not beat the best τ "
                            "before them (implies --live-tau)")
        # No argparse choices: RunConfig refuses a bad value naming the field, as the form and the API do.
        parser.add_argument("--best-by", default=RunConfig.best_by,
                            help=f"{' or '.join(BEST_BY)} (default %(default)s): the run's best checkpoint is the one "
                            "with the highest τ our evaluate stage measured on the held-out prompts, "
                            "or the one with the lowest validation loss")
        parser.add_argument("--eval-suite", dest="eval_suites", action="append", default=[], metavar="NAME=PATH",
                            help="an evaluation suite every checkpoint is measured on besides the held-out prompts: "
                            "a chat JSONL under EAGLE3WEB_DATA_ROOTS (registered under NAME), or NAME alone for a "
                            "registered one; repeat for each")
        parser.add_argument("--best-suite", default=HELD_OUT,
                            help="the suite whose τ chooses the best checkpoint (default %(default)s)")
        parser.add_argument("--best-suite-weight", dest="best_suite_weights", action="append", default=[],
                            metavar="NAME=WEIGHT", help="or choose by a weighted mix of suites' τ: once per suite, "
                            "the weights summing to 1 (e.g. held_out=0.5 code=0.5)")
        parser.add_argument("--hidden-states", default=RunConfig.hidden_states,
                            help=f"{' or '.join(HIDDEN_STATES)} (default %(default)s): online writes no extraction; "
                            "training asks vLLM capture servers for each sample and keeps a bounded cache")
        parser.add_argument("--capture-url", dest="capture_urls", action="append", default=[], metavar="URL",
                            help=f"online: a running capture server's base URL (http://host:port); once per server, "
                            f"at most {MAX_CAPTURE_SERVERS}")
        parser.add_argument("--capture-servers", type=int, default=RunConfig.capture_servers,
                            help="online: capture servers the train stage starts (default %(default)s; 0 with "
                            "--capture-url)")
        parser.add_argument("--hidden-states-cache-gib", type=float, default=RunConfig.hidden_states_cache_gib,
                            help="online: the most the run's hidden-state cache keeps on disk, in GiB (2**30 "
                            "bytes; default %(default)s)")
        parser.add_argument("--hidden-states-cache-gb", type=float, help=argparse.SUPPRESS)  # renamed: refused
        parser.add_argument("--shards", type=int, default=None, metavar="N",
                            help="split each stage that can (extraction) over N workers at once; default: one "
                            "shard per live worker taking the stage's queue, at most one per 64 rows")
        parser.add_argument("--name", default="")
        parser.add_argument("--user", default="", help="owner's username (default: the 'cli' account)")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--inline", action="store_true", help="run the stages in this process")
        mode.add_argument("--wait", action="store_true", help="enqueue, then wait for the workers to finish")
        parser.add_argument("--timeout", type=float, default=3600, help="seconds --wait waits at most")
        parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")

    def handle(self, *args, **opts):
        user = command_user(opts["user"])
        try:
            config = run_config_from(opts)
            run = services.run_launch(
                user=user, target_path=opts["target"], dataset_path=opts["dataset"], config=config,
                name=opts["name"], enqueue=not opts["inline"],
                # Inline, this process runs the stages: this host must run the backends, not a worker.
                check="this_host" if opts["inline"] else "fleet",
            )
        except (InputError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        if opts["inline"]:
            from workers.orchestration.tasks import pipeline_run_inline

            pipeline_run_inline(run_id=run.pk)
        elif opts["wait"]:
            self._wait(run, opts["timeout"])
        summary = run_summary(selectors.run_list().get(pk=run.pk))  # as the stages left it
        if opts["json"]:
            self.stdout.write(json.dumps(summary))
        else:
            self._print_human(summary)
        failed = [s["name"] for s in summary["stages"] if s["status"] in (StageStatus.FAILED, StageStatus.CANCELLED)]
        if failed:
            raise CommandError(f"run {run.pk}: stage(s) {', '.join(failed)} did not succeed; see the errors above")
        if (opts["inline"] or opts["wait"]) and summary["status"] != StageStatus.SUCCEEDED:
            raise CommandError(f"run {run.pk} is still {summary['status']} after {opts['timeout']:.0f} s")

    def _wait(self, run: PipelineRun, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if run_is_finished(selectors.run_list().get(pk=run.pk)):
                return
            time.sleep(1.0)

    def _print_human(self, summary: dict) -> None:
        self.stdout.write(f"run {summary['run_id']}: {summary['status']}")
        self.stdout.write("  " + "; ".join(f"{b['stage']}: {b['label']} on {b['gpus']} GPU(s)"
                                           for b in summary["backends"]))
        for stage in summary["stages"]:
            secs = f"{stage['seconds']:.1f} s" if stage["seconds"] is not None else "-"
            self.stdout.write(f"  {stage['name']:<8} {stage['status']:<10} {secs}")
            if stage.get("note"):
                self.stdout.write(f"    note: {stage['note']}")
            for warning in stage["warnings"]:
                self.stdout.write(f"    warning: {warning}")
            if stage["error"]:
                self.stdout.write("    " + stage["error"].splitlines()[0])
        supply = summary.get("supply") or {}
        if supply.get("measured"):  # runs.pipeline.online.selectors.supply_dict: which side was the bottleneck
            self.stdout.write("  hidden-state supply: " + "; ".join(
                f"{row['label'].lower()} {row['text']}" for row in supply["rows"][1:3]))
            if supply.get("advice"):
                self.stdout.write(f"  {supply['advice']}")
        best = summary["best"]
        for ckpt in summary["checkpoints"]:
            mark = (" (best, provisional)" if best["provisional"] else " (best)") if ckpt["is_best"] else ""
            tau = f" tau {ckpt['tau_for_best']:.2f}" if ckpt["tau_for_best"] is not None else ""
            self.stdout.write(f"  checkpoint epoch {ckpt['epoch']}: {ckpt['path']}{tau}{mark}")
        if best["text"]:
            self.stdout.write(f"  {best['text']}")
        if best["vllm_note"]:
            self.stdout.write(f"  {best['vllm_note']}")
        acceptance = summary["acceptance"]
        if acceptance["tau"] is not None:
            simulated = acceptance["simulated_tau"]
            beside = f" (simulated from validation: {simulated:.2f})" if simulated is not None else ""
            self.stdout.write(f"  acceptance length tau {acceptance['tau']:.2f}{beside}")
            self.stdout.write(f"  output equals greedy decoding: {acceptance['output_matches_greedy']}")
