"""`eagle3web runs list|launch|status|wait|cancel|create-external|end`: the client from a shell or a job script.

The server and token come from --url/--token or EAGLE3WEB_URL/EAGLE3WEB_TOKEN. With --json every answer,
errors included ({"error", "status", "fields"}), is one JSON document on stdout; without, a short text.
Exit status: 0 done, 1 the API refused or could not be reached, 2 bad command line (argparse's),
3 `wait` gave up (its timeout) and 4 `wait` saw the run end other than succeeded.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from eagle3web_client.client import ApiError, Client, WaitTimeout

EXIT_API_ERROR, EXIT_TIMEOUT, EXIT_RUN_NOT_SUCCEEDED = 1, 3, 4
# Options of POST /api/v1/runs/ (README "Launching") that take a number or a flag on the command line.
LAUNCH_INTS = ("max_seq_len", "max_samples", "draft_vocab_size", "epochs", "ttt_steps", "max_tokens_per_step",
               "seed", "eval_prompts", "eval_max_new_tokens", "tensor_parallel_size", "train_gpus")
LAUNCH_FLOATS = ("lr", "val_fraction")
LAUNCH_TEXTS = ("name", "extraction_backend", "training_backend")


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
    return p


def _launch_options(args: argparse.Namespace) -> dict:
    options: dict[str, Any] = {}
    if args.layer_ids is not None:
        try:
            options["layer_ids"] = [int(part) for part in args.layer_ids.split(",") if part.strip()]
        except ValueError:
            raise ApiError(f"--layer-ids must be comma-separated integers, got {args.layer_ids!r}",
                           fields={"layer_ids": "comma-separated integers"}) from None
    for name in (*LAUNCH_INTS, *LAUNCH_FLOATS, *LAUNCH_TEXTS, "serve_check"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
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


def _text(answer: Any) -> str:
    if isinstance(answer, list):
        return "\n".join(f"{row.get('id', '')}\t{row.get('status', '')}\t{row.get('name', '')}" for row in answer)
    if isinstance(answer, dict) and "id" in answer and "status" in answer:
        return f"run {answer['id']} {answer.get('name', '')}: {answer['status']}"
    return json.dumps(answer, indent=1)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not args.url or not args.token:
            raise ApiError("no server or token: pass --url and --token or set EAGLE3WEB_URL and EAGLE3WEB_TOKEN",
                           fields={k: "missing" for k, v in (("url", args.url), ("token", args.token)) if not v})
        with Client(args.url, args.token, timeout=args.timeout) as client:
            answer, code = run_command(client, args)
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
        print(_text(answer))
    return code


def _print(data: dict, as_json: bool, *, error: str) -> None:
    if as_json:
        print(json.dumps(data))
    else:
        print(f"eagle3web: {error}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
