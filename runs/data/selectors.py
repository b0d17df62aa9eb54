"""Reads of what runs are made from: extractions (lists, summaries, scale forecasts), datasets and target
models. Apart from runs.pipeline.selectors, whose reads are about runs; the pages, the API and the CLI
read these from here."""
from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery

from runs.data.models import Dataset, Extraction, TargetModel, Verification
from runs.pipeline.models import PipelineRun
from runs.pipeline.selectors import with_reviews
from runs.projects import access


def extraction_list() -> QuerySet[Extraction]:
    return Extraction.objects.select_related(
        "target", "produced_by__run__preparation", "imported_by", "manifest").order_by("-id")


def extraction_get(*, pk: int, user, reviews: bool = False) -> Extraction:
    """One extraction with its target, provenance and manifest (and reviews when asked); 404 when none, and
    when a run of a project the user does not see wrote it (the same words: runs.projects.access)."""
    extractions = extraction_list()
    return access.visible_or_404("extraction", pk, user, rows=with_reviews(extractions) if reviews else extractions)


def extraction_list_verified(*, user) -> QuerySet[Extraction]:
    """extraction_list() with `verified`: the latest verification's verdict (None when never verified),
    read in the list's own query rather than one query per row; those the user sees (imported ones and
    those of runs in their projects)."""
    latest = Verification.objects.filter(extraction=OuterRef("pk")).order_by("-created_at", "-id")
    return access.visible("extraction", extraction_list(), user).annotate(verified=Subquery(latest.values("passed")[:1]))


def extraction_summary(extraction: Extraction) -> dict:
    """What import_extraction and verify_extraction print: the row and its latest verification."""
    verification = extraction.latest_verification
    return {
        "extraction_id": extraction.pk,
        "directory": extraction.path,
        "layout": extraction.layout,
        "produced_by_run": extraction.produced_by.run_id if extraction.produced_by_id else None,
        "imported_by": extraction.imported_by.get_username() if extraction.imported_by_id else None,
        "imported_at": extraction.imported_at.isoformat() if extraction.imported_at else None,
        "target": {"id": extraction.target_id, "config_path": f"{extraction.target.path}/config.json"},
        "layer_ids": extraction.layer_ids,
        "layer_id_convention": extraction.layer_id_convention,
        "num_samples": extraction.num_samples,
        "total_tokens": extraction.total_tokens,
        "hidden_size": extraction.hidden_size,
        "verification": None if verification is None else {
            "id": verification.pk,
            "full": verification.full,
            "passed": verification.passed,
            "seconds": round(verification.seconds, 3),
            "checks": verification.checks,
            "failures": [f"{c['name']}: {c['message']}" for c in verification.failures],
        },
    }


def extraction_forecast(extraction: Extraction, token_counts=(10**6, 10**8, 10**9)) -> dict | None:
    """Time and disk that N tokens would take, from the load time and per-token time its extract stage
    measured and its bytes per token; None until all three are known (never for an import)."""
    stage = extraction.produced_by
    if stage is None:
        return None
    load, tps, bpt = stage.model_load_seconds, stage.tokens_per_second, extraction.bytes_per_token
    if load is None or not tps or not bpt:
        return None
    rows = [
        {
            "tokens": n,
            "seconds": load + n / tps,
            "bytes": n * bpt,
            "arithmetic": f"{load:.2f} s + {n:,} / {tps:,.0f} tok/s; {n:,} x {bpt:,.1f} B",
        }
        for n in token_counts
    ]
    return {"model_load_seconds": load, "tokens_per_second": tps, "bytes_per_token": bpt, "rows": rows}


def dataset_get(*, pk: int, user) -> Dataset:
    """A dataset (anyone signed in sees a file any project may train on); 404 in the one rule's words."""
    return access.visible_or_404("dataset", pk, user)


def dataset_list() -> QuerySet[Dataset]:
    """Datasets with the regeneration that made each (`regeneration`; absent for a file a user brought)."""
    return Dataset.objects.select_related("regeneration__source", "regeneration__target")


def dataset_preparations(dataset: Dataset, *, user, limit: int = 50) -> list:
    """The dataset's latest preparations, of runs the user sees: another project's run is not named here."""
    runs = access.visible("run", PipelineRun.objects.all(), user)
    return list(dataset.preparations.filter(run__in=runs).select_related("run").order_by("-id")[:limit])


def target_list() -> QuerySet[TargetModel]:
    return TargetModel.objects.all()


def target_by_path(path: str) -> TargetModel | None:
    return TargetModel.objects.filter(path=path).first()
