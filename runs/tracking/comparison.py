"""Reads for comparing runs side by side: the settings that differ, each curve's summary, tau, and the
acceptance per draft position of each run's best checkpoint against a baseline run.

A compare of N runs asks the database the same number of questions whatever N is (tests/views/tracking/
test_compare_acceptance.py): the runs with their stages in one query, the data policy of each run's
dataset in it too, the curves' summaries in one, the best checkpoints and their measurements in two."""
from __future__ import annotations

from django.db.models import Prefetch

from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline import best, selectors
from runs.pipeline.status.run_status import run_status
from runs.pipeline.launch.setting_bounds import HELD_OUT
from runs.projects.access import runs_visible
from runs.tracking import curves
from workers.contract.errors import InputError

MIN_RUNS, MAX_RUNS = 2, 10  # MAX_RUNS: what a sweep's compare link opens, its highest τ first
MAX_COMPARED = 50  # what one compare takes, ticked on the runs list (bench/tracker/metrics.py times 50)


class ComparisonError(InputError):
    """The runs asked for cannot be compared (too few, too many, unknown ids, a baseline not among them);
    `field`: the query parameter at fault, which the API names."""

    def __init__(self, message: str, *, field: str = "ids"):
        super().__init__(message)
        self.field = field


def _run_id(text: str, *, field: str) -> int:
    """One run id of a query parameter; anything else refused naming the parameter."""
    if len(text) > 18 or not (text.isascii() and text.isdigit()):
        raise ComparisonError(f"{field}: {text[:30]!r} is not a run id", field=field)
    return int(text)


def compare_ids(values: list[str]) -> list[int]:
    """Run ids from `?ids=1,2&ids=3`; in the order given, each once."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part and _run_id(part, field="ids") not in ids:
                ids.append(int(part))
    if not MIN_RUNS <= len(ids) <= MAX_COMPARED:
        raise ComparisonError(f"pick {MIN_RUNS} to {MAX_COMPARED} runs to compare, got {len(ids)}")
    return ids


def _flat(config: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        elif isinstance(value, dict):  # none set (no evaluation suite, no weights): listed, as unset settings are
            out[f"{prefix}{key}"] = None
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_settings(run, *, joined: bool = False) -> dict[str, object]:
    """Every setting a run ran with, flat: its paths and each field of its config. `joined`: the run was
    read with its dataset's regeneration (run_comparison), which then costs no query."""
    from runs.data.regeneration_selectors import data_policy, run_data_policy

    if run.external:  # trained elsewhere: what its trainer sent, and its paths when it named them
        return {"trained": "elsewhere (reported through the API)", "target": run.target.name if run.target_id else None,
                "target path": run.target.path if run.target_id else None,
                "dataset": run.dataset.path if run.dataset_id else None, **_flat(run.config or {})}
    # Joined: the regeneration came with the run (`dataset__regeneration__target`); absent, a file a user brought.
    policy = data_policy(run=run, job=getattr(run.dataset, "regeneration", None)) if joined else run_data_policy(run=run)
    return {"target": run.target.name, "target path": run.target.path, "dataset": run.dataset.path,
            "data": f"{'on-policy' if policy.on_policy else 'off-policy'}: {policy.why}",
            **_flat(run.config or {})}


# --- acceptance per draft position, side by side ------------------------------------------------------
# What `acceptance_per_position` holds (workers/stages/evaluate/speculative.py, measure.py): at draft
# position i, the share of the target's verification forwards whose first i drafted tokens were all
# accepted and emitted (counted after the max_new_tokens and EOS cuts; the prefill forward is not a
# verification forward), so it never rises with i and τ = 1 + its sum. Only our evaluate stage's
# measurements are read here: vLLM's per-position counters (a serve check's vllm_acceptance_per_position)
# count drafts accepted past a reply's end and are not comparable with these.

# A delta's colour, by its size in acceptance (a fraction): neutral under the first step, then one shade
# per step passed, towards blue above the baseline and towards red below it.
DELTA_STEPS = (0.005, 0.02, 0.05)


def _percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def _delta_text(delta: float) -> str:
    sign = "+" if delta > 0 else "−" if delta < 0 else "±"
    return f"{sign}{abs(100 * delta):.1f} pp"


def delta_tone(delta: float | None) -> str:
    """The colour class of a delta: "same" within the first step, "up-1".."up-3" / "down-1".."down-3"
    beyond it, "none" without one (the run or the baseline has no value at that position)."""
    if delta is None:
        return "none"
    size, shade = abs(delta), 0
    for step in DELTA_STEPS:  # a loop, not sum() over a generator: a 50-run compare asks 12,500 times
        shade += size >= step
    return "same" if shade == 0 else f"{'up' if delta > 0 else 'down'}-{shade}"


def delta_legend() -> list[dict]:
    """The colour key under the table, from DELTA_STEPS: most below the baseline first."""
    points = [f"{100 * step:g}" for step in DELTA_STEPS]
    below = [(f"down-{i + 1}", f"−{points[i]} to −{points[i + 1]} pp" if i + 1 < len(points)
              else f"−{points[i]} pp or more") for i in range(len(points))]
    above = [(f"up-{i + 1}", f"+{points[i]} to +{points[i + 1]} pp" if i + 1 < len(points)
              else f"+{points[i]} pp or more") for i in range(len(points))]
    return [{"tone": tone, "label": label} for tone, label in
            [*reversed(below), ("same", f"within ±{points[0]} pp"), *above]]


def _marked_checkpoints(runs) -> dict[int, Checkpoint]:
    """The checkpoint marked best of each run's training (runs.pipeline.best.best_decide keeps the mark on
    the best by the run's rule once its evaluate stage decided it, the trainer's until then), with
    `measured`: its succeeded measurements with a τ, newest first. Two queries for all the runs."""
    trainings = {run.training_run.pk: run for run in runs
                 if not run.external and getattr(run, "training_run", None) is not None}
    measured = (Evaluation.objects.filter(status=StageStatus.SUCCEEDED, tau__isnull=False).order_by("-id")
                .only("id", "checkpoint_id", "status", "tau", "acceptance_per_position", "prompts_path",
                      "max_new_tokens", "num_speculative_tokens", "num_prompts", "suite", "max_prompts",
                      "recommended_k"))
    marked = (Checkpoint.objects.filter(training_run_id__in=list(trainings), is_best=True)
              .only("id", "epoch", "training_run_id")
              .prefetch_related(Prefetch("evaluations", queryset=measured, to_attr="measured")))
    out: dict[int, Checkpoint] = {}
    for checkpoint in marked:
        run = trainings[checkpoint.training_run_id]
        kept = out.get(run.pk)
        # One mark per training; were there two, the one its best_epoch names.
        if kept is None or checkpoint.epoch == run.training_run.best_epoch:
            out[run.pk] = checkpoint
    return out


def _shown_measurement(run, marked: Checkpoint | None) -> tuple[Evaluation | None, Checkpoint | None]:
    """The measurement a run's acceptance shows, as the run page's (runs.pipeline.best.best_measurement):
    once the evaluate stage decided the best, the best checkpoint's latest measurement made like the
    stage's (the same prompts, count, new tokens and k), else the stage's own row; nothing before the stage
    succeeded. The best is the checkpoint marked best: best_decide marks what best_choice picks whenever a
    measurement or a serve check lands, and keeps its τ on the training, which is the τ compare shows
    (PipelineRun.shown_tau). With the checkpoint it measured, when that is the marked one."""
    stage = None if run.external else getattr(run, "evaluation", None)
    if stage is None or stage.status != StageStatus.SUCCEEDED or stage.tau is None:
        return None, None
    if marked is not None:
        alike = best._measured_alike(stage)  # the filter the choice itself applies
        chosen = next((e for e in marked.measured if all(getattr(e, k) == v for k, v in alike.items())), None)
        if chosen is not None:
            return chosen, marked
    return stage, marked if marked is not None and stage.checkpoint_id == marked.pk else None


def _unmeasured_why(run) -> str:
    if run.external:
        return "trained elsewhere: no measurement of ours"
    stage = getattr(run, "evaluation", None)
    status = stage.status if stage is not None else None
    if status == StageStatus.SUCCEEDED:
        return "not measured: its evaluate stage recorded no acceptance"
    if status in (StageStatus.FAILED, StageStatus.CANCELLED):
        return f"not measured: its evaluate stage {'failed' if status == StageStatus.FAILED else 'was cancelled'}"
    return f"not measured yet: its evaluate stage is {status or 'missing'}"


def acceptance_side_by_side(runs, *, baseline_id: int | None = None, fall_back: bool = False,
                            marked: dict[int, Checkpoint] | None = None) -> dict:
    """Each run's acceptance per draft position (its best checkpoint's measurement, `_shown_measurement`)
    and every cell's delta against one baseline run, with its text and colour.

    `positions`: 1..the largest k measured; a run with a smaller k has blank cells past its k. `rows`: per
    run, `measured`, `why` when not, `cells` (value, text, delta, delta_text, tone; value None past its k),
    `tau` (ours, 1 + the sum), the `epoch` and `checkpoint_id` measured. `baseline`: `baseline_id`, else the
    first measured run (None: none is); a `baseline_id` that is not a measured run of these is refused, or
    with `fall_back` (a page opened from a saved link) replaced by the first measured run, `refused` saying why.
    Another baseline's cells are another call (the page's select asks GET /api/v1/compare/acceptance/):
    every baseline's at once would be N² cells, most never looked at."""
    marked = _marked_checkpoints(runs) if marked is None else marked
    rows = []
    for run in runs:
        shown, checkpoint = _shown_measurement(run, marked.get(run.pk))
        values = list(shown.acceptance_per_position or []) if shown is not None else []
        measured = shown if values else None
        rows.append({"run_id": run.pk, "name": str(run), "url": run.get_absolute_url(),
                     "measured": measured is not None, "why": None if measured else _unmeasured_why(run),
                     "values": values, "k": len(values) or None, "tau": measured.tau if measured else None,
                     "evaluation_id": measured.pk if measured else None,
                     "checkpoint_id": measured.checkpoint_id if measured else None,
                     "best": bool(measured and checkpoint),  # the marked best's measurement, not the stage's row
                     "epoch": checkpoint.epoch if measured and checkpoint else None,
                     "checkpoint_url": checkpoint.get_absolute_url() if measured and checkpoint else None})
    width = max((len(row["values"]) for row in rows), default=0)
    measured_rows = [row for row in rows if row["measured"]]
    base = next((row for row in measured_rows if row["run_id"] == baseline_id), None)
    refused = None
    if base is None and baseline_id is not None:
        why = ("is not among the runs compared" if all(row["run_id"] != baseline_id for row in rows)
               else "has no measured acceptance")
        refused = f"baseline: run {baseline_id} {why}"
        if not fall_back:
            raise ComparisonError(refused, field="baseline")
    if base is None:
        base = measured_rows[0] if measured_rows else None

    def cell(row: dict, i: int) -> dict:
        if i >= len(row["values"]):  # past this run's k
            return {"position": i + 1, "value": None, "text": "", "delta": None, "delta_text": "", "tone": "blank"}
        value = row["values"][i]
        delta, delta_text, tone = None, "baseline", "base"
        if row is not base:
            if i >= len(base["values"]):
                delta_text, tone = "no baseline", "none"
            else:
                delta = round(value - base["values"][i], 6)  # 0.6 - 0.55 is 0.05, not 0.04999...
                delta_text, tone = _delta_text(delta), delta_tone(delta)
        return {"position": i + 1, "value": value, "text": _percent(value), "delta": delta,
                "delta_text": delta_text, "tone": tone}

    for row in rows:
        row["cells"] = [cell(row, i) for i in range(width)] if row["measured"] else []
    return {"positions": list(range(1, width + 1)), "rows": rows, "legend": delta_legend(), "refused": refused,
            "baseline": base["run_id"] if base else None, "baseline_name": base["name"] if base else None}


def suites_side_by_side(runs, marked: dict[int, Checkpoint] | None = None) -> dict:
    """Runs × evaluation suites: each run's best checkpoint's τ on every suite any of them measured (held_out
    first), as runs.pipeline.best keeps them (`_on_suites`: the latest measurement made as the stage measures).
    `suites`: the columns; `rows`: per run, `cells` ({suite, tau, chooses: whether the run's best is chosen by
    it, k: the k that suite's measurement recommends}), `on` (what chooses its best, in words), `epoch`,
    `recommended_k` of its held-out measurement (the "k to serve" column: held-out prompts only), `why`
    where nothing is measured yet. No query beyond _marked_checkpoints' two."""
    marked = _marked_checkpoints(runs) if marked is None else marked
    rows = []
    for run in runs:
        checkpoint = marked.get(run.pk)
        shown, measured_checkpoint = _shown_measurement(run, checkpoint)
        taus: dict[str, float] = {}
        ks: dict[str, int | None] = {}  # the k each suite's own measurement recommends, where its k table holds one
        if shown is not None and measured_checkpoint is not None:
            taus[HELD_OUT], ks[HELD_OUT] = shown.tau, shown.recommended_k
            names = list((run.config or {}).get("eval_suites") or {})
            for name, e in best.suite_measurements(checkpoint.measured, names, run.evaluation).items():
                taus[name], ks[name] = e.tau, e.recommended_k
        suite, weights = best.run_best_suite(run)
        rows.append({"run_id": run.pk, "name": str(run), "url": run.get_absolute_url(), "taus": taus, "ks": ks,
                     "choosing": set(weights) if weights else {suite},
                     "on": " + ".join(f"{w:g} {n}" for n, w in weights.items()) if weights else suite,
                     "epoch": measured_checkpoint.epoch if taus else None,
                     "recommended_k": shown.recommended_k if taus else None,
                     "why": None if taus else _unmeasured_why(run)})
    names = [HELD_OUT, *sorted({n for row in rows for n in row["taus"]} - {HELD_OUT})]
    for row in rows:
        choosing, ks = row.pop("choosing"), row.pop("ks")
        row["cells"] = [{"suite": n, "tau": row["taus"].get(n), "k": ks.get(n), "chooses": n in choosing} for n in names]
    return {"suites": names, "rows": rows}


def _compared_runs(*, run_ids: list[int], user=None) -> list:
    """The runs of `run_ids` in their order, with their stages and dataset's regeneration; `user`: only
    runs of the projects they see, another's refused as if it did not exist."""
    joined = selectors.run_list().select_related("dataset__regeneration__target")  # the data policy (run_settings)
    if user is not None:
        joined = runs_visible(joined, user)
    runs_by_id = {run.pk: run for run in joined.filter(pk__in=run_ids)}
    missing = [pk for pk in run_ids if pk not in runs_by_id]
    if missing:
        raise ComparisonError(f"no run {', '.join(str(pk) for pk in missing)}")
    return [runs_by_id[pk] for pk in run_ids]


def baseline_id_parse(value: str | None) -> int | None:
    """`?baseline=` of the compare page and API: a run id, or nothing (the first measured run)."""
    value = (value or "").strip()
    return _run_id(value, field="baseline") if value else None


def run_acceptance(*, run_ids: list[int], user=None, baseline_id: int | None = None) -> dict:
    """acceptance_side_by_side of the runs `run_ids` names (GET /api/v1/compare/acceptance/)."""
    return acceptance_side_by_side(_compared_runs(run_ids=run_ids, user=user), baseline_id=baseline_id)


def run_comparison(*, run_ids: list[int], user=None, baseline_id: int | None = None) -> dict:
    """`user`: only runs of the projects they see; another's is refused as if it did not exist.
    `baseline_id`: the acceptance table's baseline run (the first measured one when None, or when it
    cannot be one: `acceptance.refused` says why)."""
    runs = _compared_runs(run_ids=run_ids, user=user)
    settings = [run_settings(run, joined=True) for run in runs]
    names = sorted({name for s in settings for name in s})
    differ, same = [], []
    for name in names:
        values = [s.get(name) for s in settings]
        (same if all(v == values[0] for v in values) else differ).append({"name": name, "values": values})
    training_ids = [run.training_run.pk for run in runs]
    marked = _marked_checkpoints(runs)  # the best checkpoints and their measurements, for both tables
    summaries = curves.run_series_summaries(training_run_ids=training_ids)
    series_names = sorted({(s["split"], s["key"]) for rows in summaries.values() for s in rows},
                          key=lambda sk: (sk[1], sk[0]))
    by_run = [{(s["split"], s["key"]): s for s in summaries[tid]} for tid in training_ids]
    metrics = [{"split": split, "key": key, "runs": [rows.get((split, key)) for rows in by_run]}
               for split, key in series_names]
    return {
        "runs": [{"run": run, "status": run_status(run),
                  "tau": run.shown_tau,
                  "evaluation_status": None if run.external else run.evaluation.status} for run in runs],
        "differ": differ,
        "same": same,
        "metrics": metrics,
        "acceptance": acceptance_side_by_side(runs, baseline_id=baseline_id, fall_back=True, marked=marked),
        "suites": suites_side_by_side(runs, marked),
    }
