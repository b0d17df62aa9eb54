"""What a failed run or job asks of its user (workers.contract.failures): Retry where a retry can
succeed, otherwise a copy of the run with the field at fault named. Read by the run page, the launch
page's "copy with changes", the API and run_retry's refusal."""
from __future__ import annotations

from dataclasses import dataclass

from runs.pipeline.lifecycle.stage_record import StageRecord, StageStatus
from workers.contract.failures import Failure, failure_from_text


@dataclass(frozen=True)
class FailureShown(Failure):
    """A stored failure as the pages and the API show it: the contract's Failure (what stopped and what to change,
    its kind, the launch form's field at fault or "", and whether a retry can help and why), with its stage."""
    stage: str = ""   # the stage's (or job's) name

    def as_dict(self) -> dict:
        return {"stage": self.stage, "error": self.sentence, "kind": self.kind, "field": self.field,
                "retryable": self.retryable, "why": self.why}


def failure_of(record: StageRecord) -> FailureShown | None:
    """A failed row's failure; None unless it failed. A row failed before failures were classified
    (no failure_kind) is classified from its stored text."""
    if record.status != StageStatus.FAILED:
        return None
    name = record.stage_name
    read = None if record.failure_kind else failure_from_text(record.error, stage_name=name)
    return FailureShown(stage=name, sentence=record.headline, kind=record.failure_kind or read.kind,
                        field=record.failure_kind and record.failure_field or (read.field if read else ""))


def failure_fields(record) -> dict:
    """A stage's or job's error as the API gives it: "error" the sentence naming what to change,
    "error_detail" the frames for developers, "failure" {kind, field, retryable, why} when it failed."""
    failure = failure_of(record)
    return {"error": record.headline, "error_detail": record.developer_details,
            "failure": failure.as_dict() if failure else None}


def run_failure(stages) -> FailureShown | None:
    """The run's failure: its first failed stage's, from (name, label, record, ...) rows in order;
    None when no stage failed (a cancelled run can always be retried)."""
    for row in stages:
        found = failure_of(row[2])
        if found is not None:
            return found
    return None


def run_failure_by_id(*, run_id: int) -> FailureShown | None:
    """The run's failure, for "copy with changes" (the caller has checked that the user sees the run)."""
    from runs.pipeline.lifecycle.stages import STAGES

    return run_failure([(s.name, s.label, row) for s in STAGES if (row := s.model.objects.filter(run_id=run_id).first())])
