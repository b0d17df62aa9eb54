"""Client(url, token): eagle3web's REST API (/api/v1/) from a script, a notebook or a cluster job.

    client = Client("https://eagle3web.example", token=os.environ["EAGLE3WEB_TOKEN"])
    run = client.runs.launch(target="/data/llama", dataset="/data/chats.jsonl", layer_ids=[2, 16, 29], epochs=3)
    final = client.runs.wait(run["id"], timeout=3600)
    client.projects.create("kimi drafts"); client.projects.member_set("kimi drafts", "ana", "editor")

Every refusal raises ApiError with the server's status, `error` and `fields` (the API answers every error
as {"error", "fields"}). Retries, with backoff, only where trying again cannot do a thing twice:
- reads, cancels and metric batches (the server stores a point once per key, split and step, so a batch
  sent again changes nothing): on any connection error, 429 and 5xx;
- registering a checkpoint (the same path at the same epoch is the same checkpoint): likewise;
- launching and creating an external run: likewise, each call sending one `Idempotency-Key` (a fresh uuid4,
  or the caller's) on every try: the server answers a repeat of the key and body within 24 h with the run
  the first try made, so an answer lost after a launch never launches a second run;
- other writes (ending a run): only when the request cannot have been acted on (the connection was never
  made, or 429, which is answered before anything is done).
Never on another 4xx: the same request would be refused again.
"""
from __future__ import annotations

import json
import math
import numbers
import time
import uuid
from urllib.parse import quote
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

API_PREFIX = "/api/v1/"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
IDEMPOTENCY_HEADER = "Idempotency-Key"
FINISHED_STATUSES = ("succeeded", "failed", "cancelled")
MAX_POINTS_PER_BATCH = 10_000  # the server's limit for one POST of metrics


class ApiError(Exception):
    """The API refused a request (status 4xx/5xx), or it could not be reached (status None).

    `error` is the server's message, `fields` maps a request field to what is wrong with it."""

    def __init__(self, error: str, *, status: int | None = None, fields: Mapping[str, Any] | None = None,
                 method: str = "", path: str = ""):
        self.status, self.error, self.fields = status, error, dict(fields or {})
        self.method, self.path = method, path
        where = f"{method} {path}: " if method else ""
        code = f"{status} " if status is not None else ""
        super().__init__(f"{where}{code}{error}")

    def as_dict(self) -> dict:
        return {"error": self.error, "status": self.status, "fields": self.fields}


class WaitTimeout(ApiError):
    """runs.wait() gave up: the run had not finished within its timeout. `run` is the last answer seen."""

    def __init__(self, error: str, *, run: dict):
        super().__init__(error)
        self.run = run


class Client:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0, retries: int = 5,
                 backoff_seconds: float = 0.5, max_backoff_seconds: float = 8.0,
                 transport: httpx.BaseTransport | None = None):
        if not url or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if not token:
            raise ValueError("token is empty: make one on your account page or with manage.py create_api_token")
        self.url = url.rstrip("/")
        self.retries, self.backoff_seconds, self.max_backoff_seconds = retries, backoff_seconds, max_backoff_seconds
        self.retried = 0  # how many times a request was sent again (for benchmarks and logs)
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json",
            "User-Agent": "eagle3web-client/0.1"})
        self.runs = Runs(self)
        self.projects = Projects(self)
        self.checkpoints = Checkpoints(self)
        self.datasets = Datasets(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
                idempotent: bool | None = None, headers: Mapping[str, str] | None = None) -> Any:
        """One call to the API; `path` is relative to /api/v1/ ("runs/5/"). Returns the decoded JSON.

        `idempotent` (default: True for GET) says whether a request that may have reached the server can
        be sent again; `headers` go with every try (an Idempotency-Key)."""
        path = API_PREFIX + path.lstrip("/")
        idempotent = method == "GET" if idempotent is None else idempotent
        attempt = 0
        while True:
            try:
                response = self._http.request(method, path, json=body, params=params, headers=headers)
            except httpx.TransportError as exc:
                never_sent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if attempt < self.retries and (idempotent or never_sent):
                    attempt = self._pause(attempt, None)
                    continue
                raise ApiError(f"could not reach {self.url}: {type(exc).__name__}: {exc}",
                               method=method, path=path) from exc
            if response.status_code in RETRY_STATUSES and attempt < self.retries and (
                    idempotent or response.status_code == 429):
                attempt = self._pause(attempt, response.headers.get("Retry-After"))
                continue
            return _answer(response, method=method, path=path)

    def _pause(self, attempt: int, retry_after: str | None) -> int:
        wait = min(self.backoff_seconds * 2 ** attempt, self.max_backoff_seconds)
        if retry_after and retry_after.isdigit():
            wait = max(wait, min(float(retry_after), 60.0))
        time.sleep(wait)
        self.retried += 1
        return attempt + 1

    def me(self) -> dict:
        """Who the token is: username, roles, the token's name."""
        return self.request("GET", "me/")


def _answer(response: httpx.Response, *, method: str, path: str) -> Any:
    if response.status_code == 204:  # done, nothing to say (a member removed)
        return None
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.is_success:
        if data is None:
            raise ApiError(f"the server answered {response.status_code} without JSON "
                           f"({response.headers.get('Content-Type', 'no Content-Type')}): is {response.url} eagle3web?",
                           status=response.status_code, method=method, path=path)
        return data
    if isinstance(data, dict) and "error" in data:
        raise ApiError(str(data["error"]), status=response.status_code, fields=data.get("fields") or {},
                       method=method, path=path)
    raise ApiError(f"HTTP {response.status_code}: {response.text[:300]}", status=response.status_code,
                   method=method, path=path)


class Runs:
    """client.runs: the runs list, one run, launching, cancelling, waiting; external runs and their
    metrics, checkpoints and end."""

    def __init__(self, client: Client):
        self.client = client

    def list(self, *, limit: int = 50, **filters: Any) -> list[dict]:
        """Runs as the runs page lists them (filters: q, status, target, dataset, owner, tag, sort), newest
        first unless sorted otherwise; follows the pages until `limit` runs."""
        rows: list[dict] = []
        page = 1
        while len(rows) < limit:
            answer = self.client.request("GET", "runs/", params={**filters, "page": page})
            rows += answer["results"]
            if answer.get("next") is None or not answer["results"]:
                break
            page += 1
        return rows[:limit]

    def get(self, run_id: int) -> dict:
        return self.client.request("GET", f"runs/{int(run_id)}/")

    def launch(self, *, target: str, dataset: str, idempotency_key: str | None = None, **options: Any) -> dict:
        """Launch a pipeline run (run_pipeline's options in snake case: name, layer_ids, epochs, lr, ...);
        returns the run as get() does, `id` first.

        Sent again when its answer is lost, with the same `idempotency_key` (default: a fresh uuid4 per
        call), so it launches once. Pass your own key to make a call after a crash answer the run an earlier
        one launched (the server keeps a key 24 h; another body with the key is a 409)."""
        return self._create({"target": target, "dataset": dataset, **options}, idempotency_key)

    def cancel(self, run_id: int) -> dict:
        """{"id", "cancelled": how many unfinished stages were cancelled} (0 when it had finished)."""
        return self.client.request("POST", f"runs/{int(run_id)}/cancel/", body={}, idempotent=True)

    def wait(self, run_id: int, *, timeout: float | None = None, poll: float = 5.0) -> dict:
        """Poll until the run has finished (every stage succeeded, failed or was cancelled); returns its
        last answer. Raises WaitTimeout after `timeout` seconds (None: wait for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get(run_id)
            if _finished(run):
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"run {run_id} is still {run.get('status')} after {timeout:g} s", run=run)
            pause = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            time.sleep(pause)

    def create_external(self, *, name: str, config: Mapping[str, Any] | None = None, target: str | None = None,
                        dataset: str | None = None, idempotency_key: str | None = None) -> dict:
        """A run trained elsewhere (another cluster), reporting its curves, checkpoints and end here; `config`
        is the trainer's settings (epochs, lr, ttt_steps fill the run's columns), `target` and `dataset`
        paths on the server when it has them (the target then checks and serves its checkpoints).
        Sent again as launch() is, with one Idempotency-Key per call."""
        body: dict[str, Any] = {"external": True, "name": name, "config": dict(config or {})}
        body.update({k: str(v) for k, v in (("target", target), ("dataset", dataset)) if v})
        return self._create(body, idempotency_key)

    def _create(self, body: dict, idempotency_key: str | None) -> dict:
        # One key for every try of this call: a try whose answer was lost and its retry are one launch.
        key = idempotency_key or str(uuid.uuid4())
        return self.client.request("POST", "runs/", body=body, idempotent=True, headers={IDEMPOTENCY_HEADER: key})

    def log_metrics(self, run_id: int, points: Iterable[Mapping[str, Any]]) -> dict:
        """Send points ({"key", "split", "step", "value"[, "epoch"]}) in batches of at most 10,000; returns the
        summed {"accepted", "unchanged", "replaced"}. A point already stored at its key, split and step with
        the same value is unchanged, so a batch sent twice stores nothing twice.

        Every point is checked before anything is sent: one JSON cannot carry (a NaN or infinite value or
        epoch, a point that is no mapping, a value that is no number) raises ApiError (status None, fields
        {"points": ...}) naming its key, split and step, and no batch is sent. numpy and other numbers are
        sent as JSON numbers."""
        points = [_point(p, i) for i, p in enumerate(points)]
        total = {"accepted": 0, "unchanged": 0, "replaced": 0}
        for start in range(0, len(points), MAX_POINTS_PER_BATCH):
            answer = self.client.request("POST", f"runs/{int(run_id)}/metrics/",
                                         body={"points": points[start:start + MAX_POINTS_PER_BATCH]}, idempotent=True)
            for key in total:
                total[key] += int(answer.get(key, 0))
        return total

    def metrics(self, run_id: int, **params: Any) -> dict:
        """The run's curves as the run page reads them (keys, split, start, end, points)."""
        return self.client.request("GET", f"runs/{int(run_id)}/metrics/", params=params)

    def register_checkpoint(self, run_id: int, *, path: str, epoch: int, verifier: str | None = None) -> dict:
        """A checkpoint directory the run's trainer wrote (under the server's data roots), checked as
        import_checkpoint checks one; the same path at the same epoch again is the same checkpoint, so it is
        safe to send again. `verifier`: a copy of its target on the server (default: the run's target)."""
        body: dict[str, Any] = {"path": str(path), "epoch": int(epoch)}
        if verifier:
            body["verifier"] = str(verifier)
        return self.client.request("POST", f"runs/{int(run_id)}/checkpoints/", body=body, idempotent=True)

    def end(self, run_id: int, *, status: str, message: str = "") -> dict:
        """Mark an external run finished: status succeeded, failed or cancelled."""
        if status not in FINISHED_STATUSES:
            raise ValueError(f"status must be one of {', '.join(FINISHED_STATUSES)}, got {status!r}")
        return self.client.request("POST", f"runs/{int(run_id)}/end/", body={"status": status, "message": message},
                                   idempotent=False)


class Datasets:
    """client.datasets: having a target write a dataset's replies again (a regeneration, on-policy data)."""

    def __init__(self, client: Client):
        self.client = client

    def target_id(self, target: int | str) -> int:
        """The id of a target given by id, or by its folder or name on the server as GET targets/ lists
        them; ApiError naming `target` when none matches."""
        if isinstance(target, int) or (isinstance(target, str) and target.isascii() and target.isdigit()):
            return int(target)
        page = 1
        while True:
            answer = self.client.request("GET", "targets/", params={"page": page})
            found = [t["id"] for t in answer["results"] if target in (t.get("path"), t.get("name"))]
            if found:
                return found[0]
            if answer.get("next") is None or not answer["results"]:
                raise ApiError(f"target: there is no registered target {str(target)[:200]!r} (its id, folder or "
                               "name as GET /api/v1/targets/ lists them)", fields={"target": "no such target"})
            page += 1

    def regenerate(self, dataset_id: int, *, target: int | str, **options: Any) -> dict:
        """Ask for a regeneration of the dataset (options as POST datasets/<id>/regenerate/ takes them:
        backend, max_new_tokens, temperature, seed, max_samples, shards). {regeneration, queued}: the same
        settings answer the job they made already (queued false), so a lost answer is sent again safely."""
        body = {"target": self.target_id(target), **{k: v for k, v in options.items() if v is not None}}
        return self.client.request("POST", f"datasets/{int(dataset_id)}/regenerate/", body=body, idempotent=True)


class Checkpoints:
    """client.checkpoints: a checkpoint's record, and exporting it for deployment."""

    def __init__(self, client: Client):
        self.client = client

    def get(self, checkpoint_id: int) -> dict:
        return self.client.request("GET", f"checkpoints/{int(checkpoint_id)}/")

    def export(self, checkpoint_id: int, *, out_dir: str | None = None) -> dict:
        """Write a new folder on the server that vLLM serves as it is (config.json, weights, README.md model
        card): {checkpoint_id, path, files, bytes, serve_command, card}. `out_dir`: a new folder under the
        server's data roots (default: one under its runs folder's exports/). Not sent again on a lost
        answer: a second export writes a second folder."""
        body = {"out_dir": str(out_dir)} if out_dir else {}
        return self.client.request("POST", f"checkpoints/{int(checkpoint_id)}/export/", body=body, idempotent=False)


class Projects:
    """client.projects: the projects one sees (with one's role), creating one, a project's members. A
    project is named by its id or its exact name (looked up in the list)."""

    def __init__(self, client: Client):
        self.client = client

    def list(self) -> list[dict]:
        """[{id, name, open_to_all, role, runs}] of the projects whose runs you see, by name."""
        return self.client.request("GET", "projects/")["results"]

    def create(self, name: str) -> dict:
        """A new closed project owned by you (sent once: a lost answer is not retried, a repeat would be
        refused as existing)."""
        return self.client.request("POST", "projects/", body={"name": name}, idempotent=False)

    def id_of(self, project: int | str) -> int:
        """The id of a project given by id or exact name; ApiError naming `project` when none you see."""
        if isinstance(project, int) or (isinstance(project, str) and project.isascii() and project.isdigit()):
            return int(project)
        found = [p["id"] for p in self.list() if p["name"] == project]
        if not found:
            raise ApiError(f"project: there is no project {str(project)[:50]!r} you see",
                           fields={"project": "no such project"})
        return found[0]

    def members(self, project: int | str) -> dict:
        """{project, name, open_to_all, results: [{username, role}]}."""
        return self.client.request("GET", f"projects/{self.id_of(project)}/members/")

    def member_set(self, project: int | str, username: str, role: str) -> dict:
        """Add `username` with `role` (viewer, editor, owner) or change their role (owners and staff only);
        the members afterwards. Setting a role twice is the same role: retried like a read."""
        return self.client.request("POST", f"projects/{self.id_of(project)}/members/",
                                   body={"username": username, "role": role}, idempotent=True)

    def member_remove(self, project: int | str, username: str) -> None:
        """Remove `username` (owners and staff only; the last owner stays): ApiError 404 when not a member."""
        self.client.request("DELETE", f"projects/{self.id_of(project)}/members/{quote(username, safe='')}/")


def _point(point: Any, index: int) -> dict:
    """A point as JSON carries it (numpy numbers as plain ones), or ApiError naming it."""
    if not isinstance(point, Mapping):
        raise ApiError(f"point {index} is not a mapping ({type(point).__name__}): send "
                       "{\"key\", \"split\", \"step\", \"value\"}; nothing was sent",
                       fields={"points": f"point {index} is not a mapping"})
    point = {k: _plain(v) for k, v in point.items()}
    where = (f"point {index} (key {point.get('key')!r}, split {point.get('split')!r}, "
             f"step {point.get('step')!r})")
    for field, value in point.items():
        if isinstance(value, float) and not math.isfinite(value):
            problem = (f"{where} has {field} {value}: JSON has no NaN or infinity; leave the point out or send "
                       "a finite number; nothing was sent")
            raise ApiError(problem, fields={"points": problem})
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            problem = (f"{where} has {field} of type {type(value).__name__}, not a number JSON can carry; "
                       "nothing was sent")
            raise ApiError(problem, fields={"points": problem}) from None
    return point


def _plain(value: Any) -> Any:
    """numpy's (and other libraries') numbers as Python's: json cannot write a numpy.float32 or int64."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def _finished(run: Mapping[str, Any]) -> bool:
    if "finished" in run:
        return bool(run["finished"])
    return run.get("status") in FINISHED_STATUSES
