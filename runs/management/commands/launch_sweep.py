"""Launch a sweep from a shell: run_pipeline's options for what every run shares, plus --vary for what
differs, as the launch form's "Sweep" box does."""
from __future__ import annotations

import json
import time

from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError

from runs.management.command_user import command_user
from runs.management.commands import run_pipeline
from runs.sweeps.models import Sweep
from runs.sweeps import selectors, services
from runs.sweeps.spec import GRID, LIST, ITEM_SEPARATOR, SWEEP_KEYS, parse_vary
from workers.contract.errors import InputError


class Command(run_pipeline.Command):
    help = ("Launch a sweep: several runs that differ in the options given with --vary (every combination, or "
            "with --list the i-th values together), each validated as run_pipeline validates one run; one bad "
            "value stores nothing. Prints sweep_id and run_ids.")

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                            help=f"an option and its values, once per swept option; KEY is one of {', '.join(SWEEP_KEYS)} "
                            f"(a hyphen or an underscore). Values are separated by commas; layer ids within one value "
                            f"by '{ITEM_SEPARATOR}' (layer_ids=2{ITEM_SEPARATOR}4{ITEM_SEPARATOR}5,1{ITEM_SEPARATOR}3{ITEM_SEPARATOR}5); "
                            "`default` for the option's empty value")
        combine = parser.add_mutually_exclusive_group()
        combine.add_argument("--grid", dest="mode", action="store_const", const=GRID, default=GRID,
                             help="every combination of the values (default)")
        combine.add_argument("--list", dest="mode", action="store_const", const=LIST,
                             help="the i-th value of every --vary together (each lists as many values)")
        parser.add_argument("--parallel", type=int, default=1,
                            help="runs of the sweep in the queues at once (default 1); the others wait for one to "
                            "finish, so that the sweep never holds the queue ahead of other people's runs")

    def _refuse(self, message: str, as_json: bool, field: str | None = None) -> None:
        if as_json:
            self.stdout.write(json.dumps({"error": message, "field": field}))
        raise CommandError(message)

    def handle(self, *args, **opts):
        as_json = opts["json"]
        user = command_user(opts["user"])
        try:
            if not opts["vary"]:
                raise InputError("give at least one --vary KEY=V1,V2 (run_pipeline launches a single run)")
            sweep = services.sweep_launch(
                user=user, target_path=opts["target"], dataset_path=opts["dataset"],
                config=run_pipeline.run_config_from(opts), varied=[parse_vary(v) for v in opts["vary"]],
                mode=opts["mode"], name=opts["name"], parallel=opts["parallel"], enqueue=not opts["inline"],
                # Inline, this process runs the stages: this host must run the backends, not a worker.
                check="this_host" if opts["inline"] else "fleet")
        except (InputError, PermissionDenied) as exc:
            self._refuse(str(exc), as_json, getattr(exc, "field", None))
        if opts["inline"]:
            from workers.orchestration.tasks import pipeline_run_inline

            for run_id in selectors.sweep_summary(sweep=sweep)["run_ids"]:
                pipeline_run_inline(run_id=run_id)
        elif opts["wait"]:
            self._wait_all(sweep, opts["timeout"])
        summary = selectors.sweep_summary(sweep=sweep)
        if as_json:
            self.stdout.write(json.dumps(summary))
        else:
            self._print_table(summary)
        failed = [r["run_id"] for r in summary["runs"] if r["status"] in ("failed", "cancelled")]
        if failed:
            raise CommandError(f"sweep {sweep.pk}: run(s) {', '.join(map(str, failed))} did not succeed")
        if (opts["inline"] or opts["wait"]) and not summary["finished"]:
            raise CommandError(f"sweep {sweep.pk} is not finished after {opts['timeout']:.0f} s")

    def _wait_all(self, sweep: Sweep, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not selectors.sweep_summary(sweep=sweep)["finished"]:
            time.sleep(2.0)

    def _print_table(self, summary: dict) -> None:
        self.stdout.write(f"sweep {summary['sweep_id']} ({summary['name']}): {len(summary['run_ids'])} runs, "
                          f"{summary['parallel']} at a time; {summary['url']}")
        for run in summary["runs"]:
            tau = f"tau {run['tau']:.3f}" if run["tau"] is not None else ""
            settings = " ".join(f"{k}={v}" for k, v in run["settings"].items())
            self.stdout.write(f"  run {run['run_id']:<6} {settings:<40} {run['status']:<10} {tau}"
                              f"{'  (best)' if run['is_best'] else ''}")
