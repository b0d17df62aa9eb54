"""What bench/load/load.py prints: latency percentiles over its samples, gunicorn's own times from its access
log, and the CPU each side of the benchmark used (imported by it)."""
from __future__ import annotations

import contextlib
import math
import os
import re
from collections import Counter
from pathlib import Path


def percentiles(values: list[float]) -> dict:
    ordered = sorted(values)

    def at(q: float) -> float | None:  # nearest rank: the smallest value with q of all at or below it
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 1) if ordered else None

    return {"p50_ms": at(0.50), "p95_ms": at(0.95), "p99_ms": at(0.99)}


def summarize(samples: list, seconds: float) -> dict:
    """Percentiles over every request and per endpoint; a viewer's sample also says its HTTP status,
    so `not_modified` counts the polls answered 304."""
    out = {**percentiles([s[1] for s in samples]), "requests": len(samples),
           "errors": sum(1 for s in samples if not s[2]), "requests_per_s": round(len(samples) / seconds, 1),
           "endpoints": {}}
    for name in dict.fromkeys(s[0] for s in samples):
        mine = [s for s in samples if s[0] == name]
        out["endpoints"][name] = {**percentiles([s[1] for s in mine]), "requests": len(mine),
                                  "errors": sum(1 for s in mine if not s[2]),
                                  "mean_bytes": round(sum(s[3] for s in mine) / len(mine))}
        if len(mine[0]) > 4:
            out["endpoints"][name]["not_modified"] = sum(1 for s in mine if s[4] == 304)
            failed = [s for s in mine if not s[2]]
            if failed:  # what the server answered: each status (or exception) counted, and one body of each
                out["endpoints"][name]["error_statuses"] = dict(Counter(str(s[4]) for s in failed))
                out["endpoints"][name]["error_bodies"] = {str(s[4]): s[6] for s in reversed(failed) if len(s) > 6}
    if samples and len(samples[0]) > 4:
        out["not_modified"] = sum(1 for s in samples if s[4] == 304)
    return out


def cpu_use(groups: dict[str, int], database: str) -> dict[str, float]:
    """CPU seconds used so far by the machine as a whole ("machine", from /proc/stat) and by each of
    `groups` (name -> process group id: gunicorn, the trainer, this client) and this benchmark's
    PostgreSQL backends: what other people's work took is the difference. A process counts in a group when it
    or one of its ancestors is in that process group: the train stage runs its trainer in a session of its own
    (so that cancelling stops all of it), which a match on the group alone left in "others"."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    used = {"machine": (sum(map(int, fields)) - int(fields[3]) - int(fields[4])) / tick, "postgres": 0.0,
            **{name: 0.0 for name in groups}}
    procs: dict[int, tuple[int, int, float, Path]] = {}  # pid -> parent, process group, CPU seconds, /proc entry
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            procs[int(proc.name)] = (int(stat[1]), int(stat[2]), (int(stat[11]) + int(stat[12])) / tick, proc)
    by_group = {pgid: name for name, pgid in groups.items()}
    for parent, pgid, seconds, proc in procs.values():
        group, seen = by_group.get(pgid), 0
        while group is None and parent in procs and seen < 64:  # up the ancestors (64: a bound, not a depth seen)
            parent, pgid = procs[parent][0], procs[parent][1]
            group, seen = by_group.get(pgid), seen + 1
        if group is None:
            with contextlib.suppress(OSError):
                if database in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    group = "postgres"
        if group:
            used[group] += seconds
    return used


def server_times(log: Path, start: int, end: int) -> dict:
    """gunicorn's own time and bytes for each request logged between two offsets of its access log (the
    request's path, status, milliseconds, body bytes and query string): percentiles without the client's
    share, the curves' whole reads (no `start`) apart from their polls, the status alone apart from the run
    page's one poll of status and curves (`curves_start`)."""
    rows = []
    for line in log.read_bytes()[start:end].decode().splitlines():
        fields = line.split()
        if len(fields) in (4, 5) and fields[2].isdigit():
            rows.append((fields[0], float(fields[2]), int(fields[3]) if fields[3].isdigit() else 0,
                         fields[4] if len(fields) == 5 else ""))
    out = {}
    status = "/api/v1/runs/\\d+/status/$"
    # Each: the path's pattern and what the query string must hold (or not: "!"), "" for anything.
    for name, match, query in (("all", "", ""), ("status", status, ""), ("status_poll", status, "!curves_start="),
                               ("run_poll", status, "curves_start="), ("curves", "/metrics/$", ""),
                               ("curve_full", "/metrics/$", "!start="), ("curve_poll", "/metrics/$", "start="),
                               ("pages", "^/(runs/\\d+/)?$", "")):
        mine = [(ms, size) for path, ms, size, q in rows if re.search(match, path)
                and (query.lstrip("!") in q) != query.startswith("!")]
        out[name] = {**percentiles([ms for ms, _ in mine]), "requests": len(mine),
                     "mean_bytes": round(sum(size for _, size in mine) / len(mine)) if mine else None}
    return out
