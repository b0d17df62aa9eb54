"""`eagle3web runs list|launch|status|wait|cancel|create-external|end`, `eagle3web projects ...`
(eagle3web_client.cli_projects) and `eagle3web datasets regenerate` (eagle3web_client.cli_datasets): the
client from a shell or a job script.

The server and token come from --url/--token or EAGLE3WEB_URL/EAGLE3WEB_TOKEN. With --json every answer,
errors included ({"error", "status", "fields"}), is one JSON document on stdout. Without, a line for a person:
`status`, `wait` and `launch` "run 12 (name): running, train 120/400 (30%), about 2 min left, tau 2.41" (an
unnamed run is "run 12"; the stage, its progress and time left while it runs, why it failed, τ once
measured; `launch` adds the run's page), `cancel` how many stages it cancelled and the run's state, `end`
"run 12 (name) ended: failed", `list` a line per run (id, state, name, tab-separated; "no runs" on stderr),
`create-external` the new run's id alone (RUN=$(eagle3web runs create-external ...)); errors on stderr.
Exit status: 0 done, 1 the API refused or could not be reached, 2 bad command line (argparse's),
3 `wait` gave up (its timeout) and 4 `wait` saw the run end other than succeeded.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from eagle3web_client.cli_datasets import add_parsers as add_dataset_parsers, dataset_command, dataset_text
from eagle3web_client.cli_projects import add_parsers as add_project_parsers, project_command, project_text
from eagle3web_client.client import ApiError, Client, WaitTimeout

EXIT_API_ERROR, EXIT_TIMEOUT, EXIT_RUN_NOT_SUCCEEDED = 1, 3, 4
# Options of POST /api/v1/runs/ (docs/api/index.md, "Launching") that take a number or a flag on the command line.
LAUNCH_INTS = ("max_seq_len", "max_samples", "draft_vocab_size", "epochs", "ttt_steps", "max_tokens_per_step",
               "seed", "eval_prompts", "eval_max_new_tokens", "tensor_parallel_size", "train_gpus", "train_nodes",
               "capture_servers", "stop_when_tau_flat", "shards")
LAUNCH_FLOATS = ("lr", "val_fraction", "hidden_states_cache_gib")
# --project NAME: the project the run goes into (one you edit); without it, Default (docs/runs/comparing.md).
LAUNCH_TEXTS = ("name", "project", "notes", "extraction_backend", "training_backend", "best_by", "hidden_states",
                "best_suite")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle3web", description="eagle3web's REST API from the command line")
    p.add_argument("--url", default=os.environ.get("EAGLE3WEB_URL"), help="the server (default: $EAGLE3WEB_URL)")
    p.add_argument("--token", default=os.environ.get("EAGLE3WEB_TOKEN"), help="an API token (default: $EAGLE3WEB_TOKEN)")
    p.add_argument("--json", action="store_true", help="print JSON, errors included")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request")
    groups = p.add_subparsers(dest="group", required=True)
    runs = groups.add_parser("runs", help="runs").add_subparsers(dest="command", required=True)

    listing = runs.add_parser("list", help="the runs list, newest first")
    for name in ("q", "status", "target", "dataset", "owner", "tag", "sort"):
        listing.add_argument(f"--{name}")
    listing.add_argument("--limit", type=int, default=50)

    launch = runs.add_parser("launch", help="launch a pipeline run")
    launch.add_argument("--target", required=True, help="the target model's folder on the server")
    launch.add_argument("--dataset", required=True, help="the chats file on the server")
    launch.add_argument("--layer-ids", help="comma-separated layer ids, e.g. 2,16,29")
    for name in LAUNCH_INTS:
        launch.add_argument(f"--{name.replace('_', '-')}", type=int)
    for name in LAUNCH_FLOATS:
        launch.add_argument(f"--{name.replace('_', '-')}", type=float)
    for name in LAUNCH_TEXTS:
        launch.add_argument(f"--{name.replace('_', '-')}")
    launch.add_argument("--serve-check", action=argparse.BooleanOptionalAction, default=None)
    launch.add_argument("--serve-concurrency", metavar="N,N,...",
                        help="the serve check's load: concurrent requests of each level, 1 to 256 (default 1,8,32)")
    launch.add_argument("--live-tau", action=argparse.BooleanOptionalAction, default=None)
    launch.add_argument("--capture-url", dest="capture_urls", action="append", metavar="URL",
                        help="online: a running capture server's base URL; once per server")
    launch.add_argument("--eval-suite", dest="eval_suites", action="append", metavar="NAME=PATH",
                        help="an evaluation suite measured on every checkpoint: a chat file on the server, or NAME "
                        "alone for a registered suite; once per suite")
    launch.add_argument("--best-suite-weight", dest="best_suite_weights", action="append", metavar="NAME=WEIGHT",
                        help="choose the best by a mix of suites' τ: once per suite, the weights summing to 1")

    for name, helptext in (("status", "one run"), ("cancel", "cancel a run's unfinished stages")):
        runs.add_parser(name, help=helptext).add_argument("run_id", type=int)
    wait = runs.add_parser("wait", help="wait until a run has finished")
    wait.add_argument("run_id", type=int)
    wait.add_argument("--wait-timeout", type=float, default=None, help="give up after this many seconds")
    wait.add_argument("--poll", type=float, default=5.0, help="seconds between polls")

    external = runs.add_parser("create-external", help="a run trained elsewhere, reporting here; prints its id")
    external.add_argument("--name", required=True)
    external.add_argument("--config", default="{}", help="its settings as a JSON object")
    end = runs.add_parser("end", help="mark an external run finished")
    end.add_argument("run_id", type=int)
    end.add_argument("--status", required=True, choices=("succeeded", "failed", "cancelled"))
    end.add_argument("--message", default="")
    add_project_parsers(groups)
    add_dataset_parsers(groups)
    checkpoints = groups.add_parser("checkpoints", help="checkpoints").add_subparsers(dest="command", required=True)
    export = checkpoints.add_parser("export", help="write a folder vLLM serves as it is, with a README.md model card")
    export.add_argument("checkpoint_id", type=int)
    export.add_argument("--out-dir", help="a new folder under the server's data roots (default: under its exports/)")
    return p


def _launch_options(args: argparse.Namespace) -> dict:
    options: dict[str, Any] = {}
    if args.layer_ids is not None:
        try:
            options["layer_ids"] = [int(part) for part in args.layer_ids.split(",") if part.strip()]
        except ValueError:
            raise ApiError(f"--layer-ids must be comma-separated integers, got {args.layer_ids!r}",
                           fields={"layer_ids": "comma-separated integers"}) from None
    if args.serve_concurrency is not None:
        try:
            options["serve_concurrency"] = [int(part) for part in args.serve_concurrency.split(",") if part.strip()]
        except ValueError:
            raise ApiError(f"--serve-concurrency must be comma-separated whole numbers, got {args.serve_concurrency!r}",
                           fields={"serve_concurrency": "comma-separated whole numbers, 1 to 256"}) from None
    for name in (*LAUNCH_INTS, *LAUNCH_FLOATS, *LAUNCH_TEXTS, "serve_check", "live_tau", "capture_urls"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if args.eval_suites:  # NAME=PATH, or NAME alone: {"code": "/data/code.jsonl", "chat": ""}
        options["eval_suites"] = {name.strip(): path.strip() for name, _, path in
                                  (item.partition("=") for item in args.eval_suites)}
    if args.best_suite_weights:
        weights = {}
        for item in args.best_suite_weights:
            name, _, weight = item.partition("=")
            try:
                weights[name.strip()] = float(weight)
            except ValueError:
                raise ApiError(f"--best-suite-weight {item!r} must be NAME=WEIGHT",
                               fields={"best_suite_weights": "NAME=WEIGHT"}) from None
        options["best_suite_weights"] = weights
    return options


def run_command(client: Client, args: argparse.Namespace) -> tuple[Any, int]:
    runs = client.runs
    if args.command == "list":
        filters = {k: getattr(args, k) for k in ("q", "status", "target", "dataset", "owner", "tag", "sort")
                   if getattr(args, k) is not None}
        return runs.list(limit=args.limit, **filters), 0
    if args.command == "launch":
        return runs.launch(target=args.target, dataset=args.dataset, **_launch_options(args)), 0
    if args.command == "status":
        return runs.get(args.run_id), 0
    if args.command == "cancel":
        return runs.cancel(args.run_id), 0
    if args.command == "wait":
        run = runs.wait(args.run_id, timeout=args.wait_timeout, poll=args.poll)
        return run, 0 if run.get("status") == "succeeded" else EXIT_RUN_NOT_SUCCEEDED
    if args.command == "create-external":
        try:
            config = json.loads(args.config)
        except ValueError as exc:
            raise ApiError(f"--config is not JSON: {exc}", fields={"config": "a JSON object"}) from None
        if not isinstance(config, dict):
            raise ApiError("--config must be a JSON object", fields={"config": "a JSON object"})
        return runs.create_external(name=args.name, config=config), 0
    if args.command == "end":
        return runs.end(args.run_id, status=args.status, message=args.message), 0
    raise AssertionError(args.command)


# Text output: one line per run, for a person; --json is for scripts (create-external's id alone excepted,
# so that RUN=$(eagle3web runs create-external ...) works without jq).

def _one_line(text: Any) -> str:
    return " ".join(str(text or "").split())


def run_label(run: dict) -> str:
    """"run 12 (llama eagle3)", or "run 12" for a run without a name (the API names it "run 12" then)."""
    run_id = run.get("id", run.get("run_id"))
    name = _one_line(run.get("name"))
    return f"run {run_id} ({name})" if name and name != f"run {run_id}" else f"run {run_id}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{round(seconds)} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _stage(run: dict) -> str:
    """Where an unfinished (or failed) run is: its current stage, that stage's progress and time left, or
    why it failed. "" when the answer does not say (a finished run, an older server)."""
    glance = run.get("glance") or {}
    stage, state = glance.get("stage"), glance.get("stage_status")
    if not stage or not state:
        return ""
    if state == "failed":
        record = next((s for s in run.get("stages") or [] if s.get("name") == stage), {})
        error = next((line.strip() for line in str(record.get("error") or "").splitlines() if line.strip()), "")
        return f"{stage} failed: {error[:200]}" if error else f"{stage} failed"
    if run.get("finished") or state != "running":
        return "" if run.get("finished") else f"{stage} {state}"
    done, total = glance.get("progress_done") or 0, glance.get("progress_total") or 0
    if total:
        text = f"{stage} {done:,}/{total:,} ({min(100, int(100 * done / total))}%)"
    else:
        text = f"{stage} {done:,}" if done else f"{stage} started"
    eta = glance.get("eta_seconds")
    return f"{text}, about {_duration(eta)} left" if eta else text


def _tau(run: dict) -> float | None:
    tau = (run.get("acceptance") or {}).get("tau")
    return tau if tau is not None else (run.get("glance") or {}).get("best_tau")


def status_line(run: dict) -> str:
    """"run 12 (llama eagle3): running, train 120/400 (30%), about 2 min left, tau 2.41"."""
    parts = [f"{run_label(run)}: {run.get('status') or 'unknown'}", _stage(run)]
    tau = _tau(run)
    if isinstance(tau, (int, float)):
        parts.append(f"tau {tau:.2f}")
    if run.get("waiting_for_queue"):  # stored; the server hands it to the workers once its broker answers
        parts.append("waiting for the server's queue")
    return ", ".join(part for part in parts if part)


def _with_name(client: Client, answer: dict) -> dict:
    """The run as GET answers it, for the name and state a cancel's or an end's answer leaves out; the
    answer alone when that read fails (the cancel or end itself was done)."""
    try:
        return client.runs.get(answer["id"])
    except ApiError:
        return {"id": answer["id"]}


def text(client: Client, command: str, answer: Any) -> tuple[str, str]:
    """(stdout, stderr) without --json."""
    if command == "list":
        rows = "\n".join(f"{row.get('id')}\t{row.get('status')}\t{_one_line(row.get('name'))}" for row in answer)
        return (rows, "") if answer else ("", "eagle3web: no runs")
    if command == "create-external":
        return str(answer["id"]), ""
    if command == "launch":
        page = answer.get("page_url")
        return f"launched {status_line(answer)}" + (f"; {page}" if page else ""), ""
    if command == "cancel":
        run, count = _with_name(client, answer), int(answer.get("cancelled") or 0)
        state = run.get("status")
        if count:
            done = f"{count} unfinished stage{'s' if count != 1 else ''} cancelled"
            done += f", now {state}" if state else ""
        else:
            done = "nothing to cancel" + (f", already {state}" if state else "")
        return f"{run_label(run)}: {done}", ""
    if command == "end":
        run = _with_name(client, answer)
        return f"{run_label(run)} ended: {answer.get('status')}", ""
    return status_line(answer), ""  # status, wait


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not args.url or not args.token:
            raise ApiError("no server or token: pass --url and --token or set EAGLE3WEB_URL and EAGLE3WEB_TOKEN",
                           fields={k: "missing" for k, v in (("url", args.url), ("token", args.token)) if not v})
        with Client(args.url, args.token, timeout=args.timeout) as client:
            if args.group == "projects":
                answer, code = project_command(client, args), 0
                out, err = ("", "") if args.json else project_text(args, answer)
            elif args.group == "datasets":  # regenerate, the only command
                answer, code = dataset_command(client, args), 0
                out, err = ("", "") if args.json else dataset_text(args, answer)
            elif args.group == "checkpoints":  # export, the only command: the folder, then its serve line
                answer, code = client.checkpoints.export(args.checkpoint_id, out_dir=args.out_dir), 0
                out, err = ("", "") if args.json else (f"{answer['path']}\n{answer['serve_command']}", "")
            else:
                answer, code = run_command(client, args)
                out, err = ("", "") if args.json else text(client, args.command, answer)
    except WaitTimeout as exc:
        _print({**exc.as_dict(), "run": exc.run}, args.json, error=str(exc))
        return EXIT_TIMEOUT
    except ApiError as exc:
        _print(exc.as_dict(), args.json, error=str(exc))
        return EXIT_API_ERROR
    except ValueError as exc:  # Client's own checks (a url without http://)
        _print({"error": str(exc), "status": None, "fields": {}}, args.json, error=str(exc))
        return EXIT_API_ERROR
    if args.json:
        print(json.dumps(answer))
    else:
        if out:
            print(out)
        if err:
            print(err, file=sys.stderr)
    return code


def _print(data: dict, as_json: bool, *, error: str) -> None:
    if as_json:
        print(json.dumps(data))
    else:
        print(f"eagle3web: {error}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
