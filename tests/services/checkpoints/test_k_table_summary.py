"""A checkpoint's k table on the way out: the run summary's `tau_by_k` and `recommended_k` per checkpoint,
the "k to serve" beside it on the run page and the k the serve command proposes with. The table itself is
measured and checked against known answers in tests/stages/evaluate/test_k_table.py and test_evaluate.py."""
from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from tests.services.checkpoints.test_best_by_tau import _launch, _result, _summary, _trained
from runs.models import Evaluation
from runs.pipeline.lifecycle.result_records import evaluation_record, measured_alongside_record
from runs.pipeline.lifecycle.stage_services import stage_start

pytestmark = pytest.mark.django_db


def _table(taus: dict[int, float], recommended: int) -> dict:
    return {"k_max": max(taus), "draft_cost": 0.1, "recommended_k": recommended,
            "rows": {str(k): {"tau": t, "acceptance_per_position": [0.5] * k, "tokens_per_target_forward": t / (1 + 0.1 * k)}
                     for k, t in taus.items()}}


TABLES = {0: ({1: 1.5, 2: 1.7, 3: 1.8}, 1), 1: ({1: 1.8, 2: 2.3, 3: 2.5}, 2), 2: ({1: 1.9, 2: 2.6, 3: 3.1}, 3)}


def _serve_k(command: str) -> int:
    return json.loads(shlex.split(command)[-1])["num_speculative_tokens"]


def test_the_summary_and_the_serve_command_carry_each_checkpoints_k_table(user, roots, client):
    run = _launch(user, roots)
    checkpoints = _trained(run)
    marked = checkpoints[1]
    Evaluation.objects.filter(pk=run.evaluation.pk).update(checkpoint=marked)
    stage = Evaluation.objects.get(pk=run.evaluation.pk)

    def result(epoch):
        taus, recommended = TABLES[epoch]
        return dataclasses.replace(_result(checkpoints[epoch], taus[3]), k_table=_table(taus, recommended),
                                   recommended_k=recommended)

    for epoch in (0, 2):
        measured_alongside_record(measured=stage, checkpoint_id=checkpoints[epoch].pk, result=result(epoch))
    started = stage_start(stage_name="evaluate", record_id=stage.pk, worker="test").started_at
    evaluation_record(record_id=stage.pk, result=result(1), log_tail="", started_at=started)

    rows = {c["epoch"]: c for c in _summary(run)["checkpoints"]}
    for epoch, (taus, recommended) in TABLES.items():
        assert rows[epoch]["tau_by_k"] == taus
        assert rows[epoch]["recommended_k"] == recommended
        assert _serve_k(rows[epoch]["serve_command"]) == recommended  # not the trained k = 3
    client.force_login(user)
    page = client.get(run.get_absolute_url()).content.decode()
    assert page.count('class="recommended-k"') == 3
    detail = client.get(checkpoints[1].get_absolute_url()).content.decode()
    assert 'id="k-table"' in detail and 'data-k="2"' in detail
    assert "&quot;num_speculative_tokens&quot;: 2" in detail or '"num_speculative_tokens": 2' in detail


def test_the_summarys_k_is_the_one_its_serve_command_proposes_after_a_newer_measurement(user, roots):
    """A checkpoint measured again later (the checkpoint page's "measure", other prompts): the run summary's
    `recommended_k` and `tau_by_k` and the serve command beside them come from one measurement, the newest
    with a k table, as the checkpoints table and the checkpoint page show it."""
    run = _launch(user, roots)
    checkpoints = _trained(run)
    Evaluation.objects.filter(pk=run.evaluation.pk).update(checkpoint=checkpoints[1])
    stage = Evaluation.objects.get(pk=run.evaluation.pk)
    for epoch in (0, 2):  # every checkpoint measured by the stage: the best is chosen by these
        measured_alongside_record(measured=stage, checkpoint_id=checkpoints[epoch].pk, result=dataclasses.replace(
            _result(checkpoints[epoch], TABLES[epoch][0][3]), k_table=_table(*TABLES[epoch]),
            recommended_k=TABLES[epoch][1]))
    started = stage_start(stage_name="evaluate", record_id=stage.pk, worker="test").started_at
    taus, recommended = TABLES[1]
    evaluation_record(record_id=stage.pk, result=dataclasses.replace(
        _result(checkpoints[1], taus[3]), k_table=_table(taus, recommended), recommended_k=recommended),
        log_tail="", started_at=started)
    newer = {1: 1.9, 2: 2.2, 3: 3.0}
    Evaluation.objects.create(checkpoint=checkpoints[1], status="succeeded", tau=3.0, k_table=_table(newer, 3),
                              recommended_k=3)
    row = next(c for c in _summary(run)["checkpoints"] if c["epoch"] == 1)
    assert _serve_k(row["serve_command"]) == 3
    assert (row["recommended_k"], row["tau_by_k"]) == (3, newer)
