"""The admin's samples list at millions of samples, two checkouts side by side (issue 40): not a test.

    cd ../before && python ../eagle3web/bench/tracker/samples_admin.py --build 2000000 --database bench_samples_before
    .venv/bin/python bench/tracker/samples_admin.py --build 2000000 --database bench_samples     # ~2 min each
    .venv/bin/python bench/tracker/samples_admin.py --checkout ../before --database bench_samples_before \\
        --checkout . --database bench_samples --rounds 2 --json

--build makes the database with the code and migrations of the checkout it runs in (its cwd): three datasets, N
samples spread over them (a first user message of 150 to 300 characters of words and an id-like token, 0 to 23
replies, 1% excluded, one in 13 tagged needs-review), the staff user `bench-staff`; the database is kept (drop it
with `dropdb`). The timed mode runs each checkout's code on its own database (each as its migrations made it: an
index is part of what is compared), alternately, `--rounds` times, each in a process of its own: each URL twice
untimed, then `--requests` times. Prints per checkout and URL the median and p95 of the request's wall time, the SQL
time Django measured, the slowest query's median, the queries, and the 1-minute load. With --catalogue N, each
checkout instead catalogues a file of N conversations into its database, made afresh: the indexes' cost to writes.

    .venv/bin/python bench/tracker/samples_admin.py --catalogue 100000 --checkout ../before --database bench_cat_a \
        --checkout . --database bench_cat_b --rounds 2 --json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tracker.scratch_site import PG, alternately, median_p95  # noqa: E402

URLS = ["/admin/runs/datasetsample/",                               # the first page
        "/admin/runs/datasetsample/?dataset__id__exact={dataset}",  # one dataset
        "/admin/runs/datasetsample/?q=wombat",                      # a search with few matches
        "/admin/runs/datasetsample/?q=row-4242",                    # a part of an id
        "/admin/runs/datasetsample/?dataset__id__exact={dataset}&excluded__exact=1",
        "/admin/runs/datasetsample/?p={middle}",                    # the middle of the list (100 a page)
        "/datasets/{dataset}/"]                                     # the dataset page's counts

# A first user message: a question naming its row, then context; "wombat" in one sample in 5,000 (a rare search).
PREVIEW = ("'how do I ' || (ARRAY['tune', 'debug', 'profile', 'explain', 'port', 'translate'])[1 + g %% 6] || ' this ' "
           "|| (ARRAY['kernel', 'recipe', 'poem', 'contract', 'query'])[1 + (g / 7) %% 5] "
           "|| CASE WHEN g %% 5000 = 0 THEN ' wombat' ELSE '' END || ' for row-' || g || '? ' "
           "|| repeat('It has context that the assistant needs to read first. ', 2 + g %% 4)")


def django_in(checkout: str, database: str):
    sys.path.insert(0, checkout)
    os.environ["DATABASE_URL"] = f"{PG}/{database}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")
    import django

    django.setup()


def build(count: int, database: str) -> dict:
    from bench.tracker.scratch_site import recreate_database

    recreate_database(database)
    django_in(os.getcwd(), database)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    from runs.models import Dataset

    t0 = time.perf_counter()
    get_user_model().objects.create_superuser("bench-staff", password="bench-password-1")
    ids = [Dataset.objects.create(name=f"chats-{i}", path=f"/data/chats-{i}.jsonl").pk for i in range(3)]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_datasetsample (dataset_id, sample_id, line, num_turns, num_chars, preview, excluded, "
            f"tags, notes, content_hash) SELECT (%s::int[])[1 + g %% 3], 'row-' || g, g / 3, (g::bigint * 7919) %% 24, "
            f"300 + (g::bigint * 104729) %% 20000, left({PREVIEW}, 300), g %% 100 = 0, "
            "CASE WHEN g %% 13 = 0 THEN 'needs-review' ELSE '' END, '', md5(g::text) FROM generate_series(0, %s) g",
            [ids, count - 1])
        cursor.execute("VACUUM ANALYZE")
    return {"samples": count, "datasets": ids, "built_s": round(time.perf_counter() - t0, 1)}


def timed(database: str, requests: int) -> dict:
    django_in(os.getcwd(), database)
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from runs.models import Dataset, DatasetSample

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.get(username="bench-staff"))
    dataset = Dataset.objects.order_by("pk").first().pk
    middle = max(1, DatasetSample.objects.count() // 200)
    out = {}
    for template in URLS:
        url = template.format(dataset=dataset, middle=middle)
        for _ in range(2):
            client.get(url)
        wall, sql, slowest = [], [], []
        for _ in range(requests):
            with CaptureQueriesContext(connection) as queries:
                t0 = time.perf_counter()
                response = client.get(url)
                wall.append((time.perf_counter() - t0) * 1000)
            times = [float(q["time"]) * 1000 for q in queries.captured_queries]
            sql.append(sum(times))
            slowest.append(max(times))
            assert response.status_code == 200, (url, response.status_code)
        out[template] = {
            "wall_ms": median_p95(wall), "sql_ms": median_p95(sql), "slowest_query_ms_median": median_p95(slowest)[0],
            "queries": len(queries.captured_queries), "rows": response.content.count(b'name="_selected_action"'),
            "found": _found(response.content.decode()), "load_1m": float(open("/proc/loadavg").read().split()[0])}
    return out


def catalogued(conversations: int, database: str) -> dict:
    """The write side of the indexes: a catalogue pass (runs.data.curation.dataset_samples_sync) of a file of
    `conversations` ShareGPT rows into a database made afresh with this checkout's migrations."""
    import random

    from bench.tracker.scratch_site import recreate_database

    path = Path(tempfile.gettempdir()) / f"bench-samples-admin-{conversations}.jsonl"  # kept for the next round
    if not path.exists():
        rnd, words = random.Random(0), "the model answers about weather physics cooking code travel music loss".split()
        with path.open("w") as f:
            for i in range(conversations):
                turn = [{"from": "human", "value": " ".join(rnd.choices(words, k=60))},
                        {"from": "gpt", "value": " ".join(rnd.choices(words, k=120))}]
                f.write(json.dumps({"id": f"c{i}", "conversations": turn * rnd.randint(1, 3)}) + "\n")
    recreate_database(database)
    django_in(os.getcwd(), database)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from runs.data.curation import dataset_samples_sync
    from runs.models import Dataset

    dataset = Dataset.objects.create(name="chats", path=str(path))
    t0 = time.perf_counter()
    dataset_samples_sync(dataset=dataset)
    seconds = time.perf_counter() - t0
    return {"catalogue_s": round(seconds, 2), "conversations_per_s": round(conversations / seconds),
            "samples": dataset.samples.count()}


def _found(page: str) -> str | None:
    """What the page says it found (the admin's paginator, the dataset page's counts): both checkouts must agree."""
    import re

    match = re.search(r"([\d,]+) dataset samples?|([\d,]+) conversations, ([\d,]+) excluded", page)
    return match.group(0) if match else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", action="append", default=[], help="one per --checkout, in the same order")
    parser.add_argument("--build", type=int, help="make the database with this many samples, and stop")
    parser.add_argument("--checkout", action="append", default=[])
    parser.add_argument("--requests", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--catalogue", type=int, help="time a catalogue pass of this many conversations instead")
    parser.add_argument("--in-checkout", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build(args.build, args.database[0])))
        return
    if args.in_checkout:
        print(json.dumps(catalogued(args.catalogue, args.database[0]) if args.catalogue
                         else timed(args.database[0], args.requests)))
        return
    if len(args.database) != len(args.checkout):
        parser.error("give one --database for each --checkout")
    shared = ["--requests", str(args.requests)] + (["--catalogue", str(args.catalogue)] if args.catalogue else [])
    results = alternately(__file__, args.checkout, args.rounds, shared,
                          each=[["--database", database] for database in args.database])
    print(json.dumps(results, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
