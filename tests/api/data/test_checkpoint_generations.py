"""GET /api/v1/checkpoints/<id>/generations/: a checkpoint's replies token by token, as the evaluate stage
recorded them (runs.pipeline.lifecycle.result_records.measured_alongside_record). Epoch 0 of the run was measured
with the oracle stand-in (every draft accepted), epoch 1 with the one right at position 1 only, on the
same three prompts of the tiny target (tests/helpers/generations.py), EOS off."""
from __future__ import annotations

import pytest

from runs.checkpoints.models import CheckpointGenerations
from tests.api.conftest import ApiClient
from tests.helpers.generations import FULL_CHAINS, K, MAX_NEW, measured, record
from tests.services.checkpoints.test_best_by_tau import _launch, _trained

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def oracle(tiny_target):
    return measured(tiny_target, "oracle", eos=set())


@pytest.fixture(scope="module")
def first_only(tiny_target):
    return measured(tiny_target, "first", eos=set())


@pytest.fixture
def checkpoints(user, roots, oracle, first_only):
    run = _launch(user, roots)
    trained = _trained(run)
    record(stage=run.evaluation, checkpoint=trained[0], found=oracle)
    record(stage=run.evaluation, checkpoint=trained[1], found=first_only)
    return trained


def url(pk: int, **params) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"/api/v1/checkpoints/{pk}/generations/" + (f"?{query}" if query else "")


def test_it_needs_authentication(checkpoints):
    answer = ApiClient().get(url(checkpoints[0].pk))
    assert answer.status_code in (401, 403) and "authentication required" in answer.json()["error"]
    assert "prompts" not in answer.json()


def test_an_unknown_checkpoint_is_404(api, checkpoints):
    answer = api("viewer").get(url(checkpoints[2].pk + 1000))
    assert answer.status_code == 404 and answer.json()["error"]


def test_the_oracle_checkpoint_answers_every_drafted_token_accepted(api, checkpoints, oracle):
    answer = api("viewer").get(url(checkpoints[0].pk))
    assert answer.status_code == 200
    body = answer.json()
    assert body["checkpoint"] == checkpoints[0].pk and body["num_speculative_tokens"] == K
    assert body["tau"] == K + 1 and body["tokens_cap"] == 256 and body["prompts_cap"] == 64
    assert body["label"] == f"#{checkpoints[0].pk} epoch 1 of {checkpoints[0].training_run.run}"  # pages count from 1
    assert len(body["prompts"]) == body["prompts_total"] == 3
    for prompt, row in zip(oracle.prompts, body["prompts"]):
        assert row["prompt_tokens"] == len(prompt) and row["tau"] == K + 1 and len(row["tokens"]) == MAX_NEW
        first, *rest = row["tokens"]
        assert first["proposed_at"] is None and first["verify_step"] == 0 and not first["accepted"]
        assert [t["proposed_at"] for t in rest] == [1, 2, 3, None] * FULL_CHAINS
        assert [t["accepted"] for t in rest] == [True, True, True, False] * FULL_CHAINS
        assert all(t["rejected"] is None for t in row["tokens"])
        assert set(row["tokens"][0]) == {"text", "id", "proposed_at", "accepted", "verify_step", "rejected"}
        assert all(isinstance(t["text"], str) and isinstance(t["id"], int) for t in row["tokens"])


def test_the_first_only_checkpoint_answers_one_accepted_and_a_correction_per_forward(api, checkpoints):
    body = api("viewer").get(url(checkpoints[1].pk)).json()
    assert body["tau"] == 2.0
    forwards = (MAX_NEW - 1) // 2  # each forward: one accepted draft and the target's correction
    for row in body["prompts"]:
        assert row["tau"] == 2.0 and row["verify_forwards"] == forwards
        rest = row["tokens"][1:]
        assert [t["proposed_at"] for t in rest] == [1, None] * forwards
        corrections = rest[1::2]
        assert all(t["rejected"]["id"] == t["id"] + 1 and t["rejected"]["position"] == 2 for t in corrections)
        assert [t["verify_step"] for t in rest] == [s for s in range(1, forwards + 1) for _ in range(2)]


def test_the_same_prompts_match_across_checkpoints(api, checkpoints):
    hashes = [[p["prompt_sha256"] for p in api("viewer").get(url(c.pk)).json()["prompts"]] for c in checkpoints.values()
              if c.epoch < 2]
    assert hashes[0] == hashes[1] and len(set(hashes[0])) == 3


def test_filters_by_prompt_length_and_tau(api, checkpoints, oracle):
    lengths = sorted(len(p) for p in oracle.prompts)
    body = api("viewer").get(url(checkpoints[0].pk, prompt_tokens_min=lengths[1])).json()
    assert sorted(p["prompt_tokens"] for p in body["prompts"]) == [n for n in lengths if n >= lengths[1]]
    assert body["prompts_total"] == 3
    assert api("viewer").get(url(checkpoints[0].pk, tau_max=3.9)).json()["prompts"] == []
    assert len(api("viewer").get(url(checkpoints[0].pk, tau_min=4, tau_max=4)).json()["prompts"]) == 3


@pytest.mark.parametrize("param, value", [("tau_min", "fast"), ("prompt_tokens_max", "1.5"), ("tau_min", "nan"),
                                          ("tau_max", "-1"), ("colour", "red")])
def test_a_bad_filter_is_400_naming_it(api, checkpoints, param, value):
    answer = api("viewer").get(url(checkpoints[0].pk, **{param: value}))
    assert answer.status_code == 400 and list(answer.json()["fields"]) == [param]


def test_a_checkpoint_never_measured_answers_no_prompts(api, checkpoints):
    body = api("viewer").get(url(checkpoints[2].pk)).json()
    assert body["evaluation"] is None and body["prompts"] == [] and body["checkpoint"] == checkpoints[2].pk
    assert CheckpointGenerations.objects.filter(checkpoint=checkpoints[2]).count() == 0


def test_the_stage_rows_own_measurement_is_recorded_and_the_latest_one_answers(api, user, roots, oracle, first_only):
    """Epoch 1 measured beside the stage's row (oracle), then by the stage's row itself (first only): the
    stage's, the later, answers."""
    from runs.models import Evaluation
    from runs.pipeline.lifecycle.result_records import evaluation_record
    from runs.pipeline.lifecycle.stage_services import stage_start
    from tests.helpers.generations import result_of

    run = _launch(user, roots)
    trained = _trained(run)
    record(stage=run.evaluation, checkpoint=trained[1], found=oracle)
    assert api("viewer").get(url(trained[1].pk)).json()["tau"] == K + 1
    Evaluation.objects.filter(pk=run.evaluation.pk).update(checkpoint=trained[1])
    started = stage_start(stage_name="evaluate", record_id=run.evaluation.pk, worker="test").started_at
    evaluation_record(record_id=run.evaluation.pk, result=result_of(checkpoint=trained[1], found=first_only),
                      log_tail="", started_at=started)
    body = api("viewer").get(url(trained[1].pk)).json()
    assert body["evaluation"] == run.evaluation.pk and body["tau"] == 2.0
    assert [t["proposed_at"] for t in body["prompts"][0]["tokens"][1:5]] == [1, None, 1, None]
    assert CheckpointGenerations.objects.filter(checkpoint=trained[1]).count() == 2


def test_compare_with_offers_measured_checkpoints_of_the_runs_one_sees(people, checkpoints, user, roots, oracle):
    """A checkpoint page's "Compare with" choices: the other measured checkpoint of its run, and none of a run
    in a closed project the viewer is not a member of (its name would show)."""
    from runs.checkpoints.generation_selectors import compare_choices
    from runs.models import PipelineRun
    from runs.projects.models import Project

    closed = _launch(user, roots)
    PipelineRun.objects.filter(pk=closed.pk).update(project=Project.objects.create(name="closed"))
    hidden = _trained(closed)[0]
    record(stage=closed.evaluation, checkpoint=hidden, found=oracle)
    viewer, admin = people["viewer"][0], people["admin"][0]
    assert [c["id"] for c in compare_choices(checkpoint=checkpoints[0], user=viewer)] == [checkpoints[1].pk]
    assert [c["id"] for c in compare_choices(checkpoint=checkpoints[0], user=admin)] == [checkpoints[1].pk, hidden.pk]
