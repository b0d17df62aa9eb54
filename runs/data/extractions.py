"""Writes for extractions users already have: import them, verify them."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from eagle3web.db import db_retry
from runs.data.models import Extraction, Manifest, TargetModel, Verification, VerificationOverride
from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES
from runs.data.paths import PathNotAllowed, check_under_data_roots, shown_path
from runs.projects import access
from runs.roles import require
from runs.pipeline.services import target_register
from workers.contract.errors import InputError
from workers.contract.extraction.verify import VerificationReport, verify_extraction
from workers.contract.extraction.layout import detect_layout, read_manifest


def _target_for(*, target_path: str | Path | None, model_path: str | None) -> TargetModel:
    if target_path:
        return target_register(path=target_path)
    if model_path:
        try:
            return target_register(path=model_path)
        except InputError as exc:
            raise PathNotAllowed(
                f"the manifest names the target {model_path!r}, which cannot be used here ({exc}); "
                f"pass --target DIR with the target's config.json"
            ) from None
    raise PathNotAllowed("this extraction does not name its target model; pass --target DIR")


def _format_version(raw: dict) -> str:
    """'1' (flat), '2.0' (speculators v0.4), or 'none' where speculators 0.9 wrote no manifest."""
    return str(raw.get("data_format_version", raw.get("version", "none")))[:20]


def extraction_import(
    *, path: str | Path, target_path: str | Path | None = None, user: AbstractBaseUser | None = None,
    verify_on_worker: bool = False,
) -> tuple[Extraction, bool]:
    """Register an extraction directory (flat v1, speculators v0.4 or 0.9) and verify its headers.

    Importing a directory already known, whether imported before or written by a run here, returns
    that extraction (created is False), so a run's own extraction stays linked to its run; one of a run
    in a project the user does not see is refused, naming neither (runs.projects.access). A new one
    records who imported it, when, and from which path; no stage row is made up for it. A directory
    whose layout or manifest cannot be read raises an error naming the file; nothing is stored.
    The headers are verified here, or by a worker after commit with `verify_on_worker`.
    """
    if user is not None:
        require(user, "import")
    resolved = check_under_data_roots(path, kind="extraction directory")
    existing = (Extraction.objects.filter(path=str(resolved))
                .order_by(F("produced_by").asc(nulls_last=True), "pk").first())
    if existing:
        # A run's folder in a project the user does not see: refused without its id or its run's name
        # (runs.projects.access), rather than handed back as an extraction they would then be 404'd.
        if user is not None and not access.visible_ids("extraction", [existing.pk], user):
            refused = InputError(f"{shown_path(str(resolved))} is the extraction folder of a run in a project you "
                                 "do not see; copy it to a folder of your own to import it")
            refused.field = "path"
            raise refused
        return existing, False
    layout = detect_layout(resolved)
    claims = read_manifest(resolved, layout)
    target = _target_for(target_path=target_path, model_path=claims.model_path)
    with transaction.atomic():
        extraction = Extraction.objects.create(
            target=target,
            imported_by=user,
            imported_at=timezone.now(),
            imported_from=str(path)[:1000],
            layout=layout.name,
            path=str(resolved),
            layer_ids=list(claims.layer_ids or []),
            layer_id_convention=claims.layer_id_convention or "",
            num_samples=claims.total_samples,
            total_tokens=claims.total_tokens,
            hidden_size=claims.hidden_size,
            dtype=claims.dtype or "",
        )
        Manifest.objects.create(
            extraction=extraction,
            path=str(claims.manifest_path or resolved),
            format_version=_format_version(claims.raw or {}),
            data=claims.raw or {},
        )
    if verify_on_worker:  # the web form: reading the headers of many files takes longer than a request should
        from runs.pipeline.jobs.services import extraction_verify_request

        extraction_verify_request(extraction=extraction, full=False, user=user)
    else:
        extraction_verify(extraction=extraction, full=False, user=user)
    return extraction, True


def extraction_verify(
    *, extraction: Extraction, full: bool = False, prepared_dir: Path | None = None,
    user: AbstractBaseUser | None = None, on_progress: Callable[[int, int], None] | None = None,
    requested_by: AbstractBaseUser | None = None,
) -> Verification:
    """Check the files against the manifest and the target; store every check with its numbers.

    `user` is None for the pipeline's own check and for the import's first check; a worker running
    a verification request passes `requested_by`, whose role was checked when they asked."""
    if user is not None:
        require(user, "verify")
    run = extraction.run
    if prepared_dir is None and run is not None and run.preparation.out_dir:
        # A run's own extraction is checked token by token against the rows it was made from.
        prepared_dir = Path(run.preparation.out_dir)
    report = verify_extraction(
        Path(extraction.path), target_dir=Path(extraction.target.path), prepared_dir=prepared_dir, full=full,
        on_progress=on_progress,
    )
    # Layer ids and totals measured from the files fill what a manifest-less layout left open.
    # Only those fields are written: a running stage's status belongs to the worker.
    changes = {}
    if not extraction.layer_ids and report.claims.layer_ids:
        changes.update(layer_ids=list(report.claims.layer_ids),
                       layer_id_convention=report.claims.layer_id_convention or "")
    if extraction.produced_by_id is None:  # a run's stage measured its own
        changes["bytes_on_disk"] = report.bytes_on_disk
        if extraction.total_tokens is None:
            changes["total_tokens"] = report.total_tokens
    # The files were read (minutes, for a large extraction): a locked or lost database while the
    # verdict is stored is waited out, not a reason to read them again.
    verification = db_retry("verification", _verification_store, extraction=extraction, report=report, full=full,
                            created_by=user or requested_by, changes=changes)
    for field, value in changes.items():
        setattr(extraction, field, value)
    return verification


@transaction.atomic
def _verification_store(*, extraction: Extraction, report: VerificationReport, full: bool,
                        created_by: AbstractBaseUser | None, changes: dict) -> Verification:
    """Store the verdict and `changes` to the extraction's columns; the object itself is left as it
    was, so that a try after a locked or lost database starts from the same state."""
    data = report.as_dict()
    verification = Verification.objects.create(
        extraction=extraction,
        full=full,
        passed=report.passed,
        layout=report.layout,
        checks=data["checks"],
        report={k: v for k, v in data.items() if k != "checks"},
        seconds=report.seconds,
        created_by=created_by,
    )
    if changes:
        Extraction.objects.filter(pk=extraction.pk).update(**changes)
    return verification


def verification_override(*, extraction: Extraction, user: AbstractBaseUser, reason: str) -> VerificationOverride:
    """Let training use this extraction although its latest verification failed; the reason is kept."""
    require(user, "review")
    verification = extraction.latest_verification
    if verification is None or verification.passed:
        raise InputError("nothing to override: the latest verification of this extraction did not fail")
    if not reason.strip():
        raise InputError("an override needs a written reason")
    if extraction.verification_requests.exclude(status__in=FINISHED_STATUSES).exists():
        # The override would hold for the verdict now on the page, not for the one under way.
        raise InputError("a verification of this extraction is queued or running; wait for its verdict, "
                         "then override it if it fails")
    return VerificationOverride.objects.create(verification=verification, reviewer=user, reason=reason.strip())


def extraction_training_gate(*, extraction: Extraction) -> str | None:
    """None if training may start from this extraction, else why not and what to do."""
    verification = extraction.latest_verification
    if verification is None:
        return f"extraction {extraction.pk} has not been verified; verify it first"
    if verification.passed or verification.overrides.exists():
        return None
    failures = "; ".join(f"{c['name']}: {c['message']}" for c in verification.failures)
    return (f"extraction {extraction.pk} failed verification ({failures}); fix the files, or a reviewer can "
            f"override with a written reason on the extraction page, then retry the run")
