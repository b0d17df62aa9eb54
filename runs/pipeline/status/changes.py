"""Change counters: how a live page learns, in one indexed read, whether anything it shows changed.

Each run counts the writes to what its pages show (`PipelineRun.changes`: its stage rows, attempts,
checkpoints, measurements, serve checks and curves) and, apart, the writes to its curves alone
(`curve_changes`) and to its state as the runs list shows it (`state_changes`: stage statuses and
results, checkpoints, measurements; not a running stage's progress and log, nor its curves, which move
every few seconds while it trains). The status and curve endpoints derive their ETags from them and
key the answers they cache by them (runs.live), the runs list its table (runs_list_version): a poll
of an unchanged run costs one small query and no rendering, and a cached answer is never stale because
a write moves the key instead of deleting it.

Who moves them:
- every stage or job row (runs.pipeline.lifecycle.stage_record.StageRecord), through its manager: `.update()` and
  `.save()` count for the runs of the rows they wrote (StageQuerySet), so no writer of a stage can forget;
  a job of no run (a catalogue, a verification, a regeneration) counts for none;
- the curves' write path (runs.tracking.services) through curves_changed, or, for a batch of points that is its
  own transaction (a worker's), by curves_bump_sql inside it, its last write before its commit;
- checkpoint writes (runs.pipeline.lifecycle.result_records, stage_services) through training_changed.
Each bump of a state counter also moves the runs list's change count (LIST_CHANGES, a sequence on PostgreSQL),
as do the bulk edits that move state counters themselves and a run's deletion (runs_list_changed): the list's
version reads it, not every run's counter. Reviews and tags do not count here: the runs list reads their own
tables' counts (runs_list_version), and the run page reads them on each request.

A count moves once the write is committed (transaction.on_commit; at once outside a transaction; with the
commit itself for a batch of points that bumps inside its own transaction):
readers read the counter before the rows, so the worst they do is file newer rows under the older
count, which the bump then retires; and no transaction holds a run's row while it waits for another
lock (a worker failing a stage while a user cancels the run would otherwise deadlock). A bump that
fails after its commit is logged and lost: pages miss that write until the run's next one or until
the cached answers expire (runs.live: seconds for a running run, an hour otherwise). A bump is
committed without waiting for the disk (CounterBump), so a crash of PostgreSQL itself may lose the
last ones the same way.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from django.apps import apps
from django.db import connection, transaction
from django.db.models import F

from eagle3web.db import CompiledQuery, compile_query, stand_in

# Fields a worker renews without changing anything a page shows: writing only these counts for nothing.
UNSHOWN_FIELDS = frozenset({"lease_expires_at"})
# A running stage's progress report: the run's pages show it, the runs list does not.
PROGRESS_FIELDS = frozenset({"progress_done", "progress_total", "log_tail", "lease_expires_at"})
ALL, PROGRESS, CURVES = ("changes", "state_changes"), ("changes",), ("changes", "curve_changes")


def _model(name: str):
    # By name: the stage rows' manager (runs.pipeline.lifecycle.stage_record) uses this module, and the models
    # import it.
    return apps.get_model("runs", name)


@dataclass(frozen=True)
class CounterBump:
    """Moving `counters` of the runs `run_filter` picks, once the write is committed (a callback of
    transaction.on_commit; tests that count the queue's hand-overs among those callbacks leave these out)."""

    run_filter: tuple
    counters: tuple[str, ...]

    def __call__(self) -> None:
        if connection.vendor != "postgresql" or connection.in_atomic_block:
            _model("PipelineRun").objects.filter(**dict(self.run_filter)).update(
                **{name: F(name) + 1 for name in self.counters})
            if "state_changes" in self.counters:
                _list_changes_move()
            return
        # Committed without waiting for the disk (synchronous_commit off, for this statement's own transaction:
        # two statements in one query run as one). Waiting flushed the WAL a second time per batch of points,
        # 0.6 to 2.9 ms against 0.15 to 0.35 without (issue 40). A crash of PostgreSQL may lose the last such
        # bumps, as a bump that fails is lost (this module's docstring): the next durable commit, a batch of
        # points included, writes out every one before it.
        shape = tuple((name, len(value) if isinstance(value, tuple) else None) for name, value in self.run_filter)
        values = {f"{name}{i}": v for name, value in self.run_filter
                  for i, v in enumerate(value if isinstance(value, tuple) else (value,))}
        runs = _runs_picked(shape)
        with connection.cursor() as cursor:
            cursor.execute(_bump_sql(self.counters, runs.sql), runs.params(**values))


@lru_cache(maxsize=64)
def _runs_picked(shape: tuple[tuple[str, int | None], ...]) -> CompiledQuery:
    """The ids of the runs a CounterBump's filter of this shape picks (its lookups, and how many ids each `__in`
    holds), compiled once: the ORM compiling it took more of a batch of points' Python than anything else left.
    Its values are named after their lookup and place: `pk__in0`, `pk__in1`, `training_run__pk0`."""
    stand_ins, lookups, n = {}, {}, 0
    for name, size in shape:
        ids = []
        for i in range(size if size is not None else 1):
            stand_ins[f"{name}{i}"] = stand_in(n)
            ids.append(stand_in(n))
            n += 1
        lookups[name] = tuple(ids) if size is not None else ids[0]
    return compile_query(_model("PipelineRun").objects.filter(**lookups).values("pk"), **stand_ins)


@lru_cache(maxsize=64)
def _bump_sql(counters: tuple[str, ...], runs: str) -> str:
    counted = ", ".join(f'"{name}" = "{name}" + 1' for name in counters)
    listed = f"; SELECT nextval('{LIST_CHANGES}')" if "state_changes" in counters else ""
    return (f'SET LOCAL synchronous_commit TO OFF; UPDATE "{_model("PipelineRun")._meta.db_table}" SET {counted} '
            f'WHERE "id" IN ({runs}){listed}')


# The runs list's change count (migration 0037), on PostgreSQL: moved with every state counter's bump, after the
# commit, and read by runs_list_version in constant time. A sequence's nextval takes no lock (writers never wait on
# one another) and is not undone by a rollback, which costs a needless rebuild at worst.
LIST_CHANGES = "runs_list_changes"


def _list_changes_move() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT nextval(%s)", [LIST_CHANGES])


def run_deleted(sender, **kwargs) -> None:
    """post_delete of a run (the admin's, a cascade's): the list must drop it (runs/apps.py connects this)."""
    runs_list_changed()


def runs_list_changed() -> None:
    """Count a write to what the runs list shows that moves no run's state counter through CounterBump (a bulk
    update that moves them itself, a run deleted), once it is committed: once however many runs the transaction
    deletes (_on_commit_once)."""
    _on_commit_once(_list_changes_move)


def _bump(counters: tuple[str, ...], **run_filter) -> None:
    """Once per transaction: a request that writes a run's curves many times (a batch per series, system
    samples, then progress) moves each counter once (_on_commit_once)."""
    _on_commit_once(CounterBump(run_filter=tuple(sorted(run_filter.items())), counters=counters))


def _on_commit_once(move) -> None:
    """Run `move` after the commit, unless an equal one is pending already. Only one pending under the very
    savepoints open now stands for it: it runs exactly when this one would (one registered in a savepoint since
    released may belong to work an enclosing block still rolls back, or to a test's transaction that never
    commits while the test runs its own callbacks)."""
    conn = transaction.get_connection()
    if conn.in_atomic_block:
        open_now = set(conn.savepoint_ids)
        if any(sids == open_now and func == move for sids, func, *_ in conn.run_on_commit):
            return
    transaction.on_commit(move, robust=True)


def runs_changed(*, run_ids: Iterable[int | None], progress: bool = False) -> None:
    """Count a write to what these runs' pages show (None entries: rows of no run); `progress`: only a
    running stage's progress and log, which the runs list does not show."""
    ids = tuple(sorted({pk for pk in run_ids if pk is not None}))
    if ids:
        _bump(PROGRESS if progress else ALL, pk__in=ids)


def training_changed(*, training_run_id: int) -> None:
    """Count a write to a training's checkpoints for its run."""
    _bump(ALL, training_run__pk=training_run_id)


def curves_changed(*, training_run_id: int) -> None:
    """Count a write to a training's curves: its pages' counter and its curves' (the run's summary shows
    the latest values), not its state."""
    _bump(CURVES, training_run__pk=training_run_id)


@lru_cache(maxsize=1)
def curves_bump_sql() -> str:
    """curves_changed as one statement (its parameter: the training run's id) for a writer to run inside its own
    transaction as its last write before the commit (runs.tracking.services.metrics_record): the bump after
    commit was a transaction of its own, a round trip and a commit more per batch of points (issue 40).
    The run's row is then held only from this statement to the commit, waiting for no other lock after it, as
    this module's docstring asks; it moves with the write's own commit, so no crash loses it."""
    runs, trainings = _model("PipelineRun")._meta.db_table, _model("TrainingRun")._meta.db_table
    counted = ", ".join(f'"{name}" = "{name}" + 1' for name in CURVES)
    return f'UPDATE "{runs}" SET {counted} WHERE "id" = (SELECT "run_id" FROM "{trainings}" WHERE "id" = %s)'


def run_lookups(model) -> tuple[str, ...]:
    """How a stage or job row reaches the runs whose pages show it: its own `RUN_LOOKUPS`, else its
    `run` when it has one (a pipeline stage), else nothing (a job of no run)."""
    lookups = getattr(model, "RUN_LOOKUPS", None)
    if lookups is not None:
        return tuple(lookups)
    return ("run_id",) if any(f.name == "run" for f in model._meta.concrete_fields) else ()


def stage_row_saved(row) -> None:
    """A stage or job row was saved: count it for its runs (one query for a job reached through others)."""
    lookups = run_lookups(type(row))
    if lookups == ("run_id",):
        runs_changed(run_ids=[row.run_id])
    elif lookups:
        values = type(row)._base_manager.filter(pk=row.pk).values_list(*lookups).first() or ()
        runs_changed(run_ids=values)


@dataclass(frozen=True)
class RunCounters:
    changes: int
    curve_changes: int
    state_changes: int


def run_counters(*, run_id: int, user=None) -> RunCounters | None:
    """A run's counters (None when there is no such run, or, with `user`, when its project is not one
    they see): what a poll reads first. The project check rides in the same query, so that the answer
    cached for every viewer is never handed to one who may not see the run, and a 304 still costs one read."""
    from runs.projects.visible_run import visible_run_row  # here: the stage rows' manager imports this module early

    fields = ("changes", "curve_changes", "state_changes")
    if user is None:
        row = _model("PipelineRun").objects.filter(pk=run_id).values_list(*fields).first()
    else:  # compiled once: a page polls this every few seconds (issue 40)
        row = visible_run_row(run_id=run_id, user=user, fields=fields)
    return None if row is None else RunCounters(*row)


def runs_list_version_sql() -> str:
    """runs_list_version's statement, one row of numbers: the runs list page sends it beside its viewer's
    reads (runs.saved_views.viewer_reads), as a subquery of theirs."""
    runs, reviews = _model("PipelineRun")._meta.db_table, _model("Review")._meta.db_table
    links = _model("RunTag").runs.through._meta.db_table
    others = (f'(SELECT MAX("id") FROM "{runs}"), (SELECT COUNT(*) FROM "{reviews}"), (SELECT MAX("id") FROM "{reviews}"), '
              f'(SELECT COUNT(*) FROM "{links}"), (SELECT MAX("id") FROM "{links}")')
    if connection.vendor == "postgresql":
        # The list's change count (LIST_CHANGES; is_called tells its first value from none), where the runs' count
        # and the sum of their state counters read every run (16 ms at 100,000 runs); the newest id from the primary
        # key's index.
        return f'SELECT changed.last_value + changed.is_called::int, {others} FROM "{LIST_CHANGES}" AS changed'
    return (f'SELECT counted.runs, counted.state, {others} '
            f'FROM (SELECT COUNT(*) AS runs, SUM("state_changes") AS state FROM "{runs}") AS counted')


def runs_list_version_text(row: Iterable) -> str:
    return ".".join(str(value or 0) for value in row)


def runs_list_version() -> str:
    """What the runs list shows moves this (one query): the list's change count (on SQLite how many runs there are
    and the sum of their state counters) and the newest run's id; how many reviews and tag links there are and the
    newest of each."""
    with connection.cursor() as cursor:
        cursor.execute(runs_list_version_sql())
        return runs_list_version_text(cursor.fetchone())
