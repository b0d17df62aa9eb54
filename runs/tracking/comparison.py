"""Reads for comparing runs side by side: the settings that differ, each curve's summary, tau."""
from __future__ import annotations

from runs.pipeline import selectors
from runs.tracking import curves
from workers.contract.errors import InputError

MIN_RUNS, MAX_RUNS = 2, 10


class ComparisonError(InputError):
    """The runs asked for cannot be compared (too few, too many, unknown ids)."""


def compare_ids(values: list[str]) -> list[int]:
    """Run ids from `?ids=1,2&ids=3`; in the order given, each once."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if len(part) > 18 or not (part.isascii() and part.isdigit()):
                raise ComparisonError(f"ids: {part[:30]!r} is not a run id")
            if int(part) not in ids:
                ids.append(int(part))
    if not MIN_RUNS <= len(ids) <= MAX_RUNS:
        raise ComparisonError(f"pick {MIN_RUNS} to {MAX_RUNS} runs to compare, got {len(ids)}")
    return ids


def _flat(config: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_settings(run) -> dict[str, object]:
    """Every setting a run ran with, flat: its paths and each field of its config."""
    from runs.data.regeneration_selectors import run_data_policy

    if run.external:  # trained elsewhere: what its trainer sent, and its paths when it named them
        return {"trained": "elsewhere (reported through the API)", "target": run.target.name if run.target_id else None,
                "target path": run.target.path if run.target_id else None,
                "dataset": run.dataset.path if run.dataset_id else None, **_flat(run.config or {})}
    policy = run_data_policy(run=run)
    return {"target": run.target.name, "target path": run.target.path, "dataset": run.dataset.path,
            "data": f"{'on-policy' if policy.on_policy else 'off-policy'}: {policy.why}",
            **_flat(run.config or {})}


def run_comparison(*, run_ids: list[int]) -> dict:
    runs_by_id = {run.pk: run for run in selectors.run_list().filter(pk__in=run_ids)}
    missing = [pk for pk in run_ids if pk not in runs_by_id]
    if missing:
        raise ComparisonError(f"no run {', '.join(str(pk) for pk in missing)}")
    runs = [runs_by_id[pk] for pk in run_ids]
    settings = [run_settings(run) for run in runs]
    names = sorted({name for s in settings for name in s})
    differ, same = [], []
    for name in names:
        values = [s.get(name) for s in settings]
        (same if all(v == values[0] for v in values) else differ).append({"name": name, "values": values})
    training_ids = [run.training_run.pk for run in runs]
    summaries = curves.run_series_summaries(training_run_ids=training_ids)
    series_names = sorted({(s["split"], s["key"]) for rows in summaries.values() for s in rows},
                          key=lambda sk: (sk[1], sk[0]))
    by_run = [{(s["split"], s["key"]): s for s in summaries[tid]} for tid in training_ids]
    metrics = [{"split": split, "key": key, "runs": [rows.get((split, key)) for rows in by_run]}
               for split, key in series_names]
    return {
        "runs": [{"run": run, "status": selectors.run_status(run),
                  "tau": None if run.external else run.evaluation.tau,
                  "evaluation_status": None if run.external else run.evaluation.status} for run in runs],
        "differ": differ,
        "same": same,
        "metrics": metrics,
    }
