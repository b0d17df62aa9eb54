"""A run's best checkpoint: which one it is, why, and marking it.

Under `best_by` "tau" (RunConfig's default) the best is the checkpoint with the highest τ our evaluate
stage measured on the run's held-out prompts; on a tie to TAU_DECIMALS the lower validation loss, then
the earlier epoch. Under "val_loss" it is the lowest validation loss, the trainers' own choice.

One measure over every checkpoint: ours, which the evaluate stage makes of each. vLLM's τ (a serve
check's emitted-token τ) is known only for the checkpoints someone served, so it never chooses: a run
that asks for a serve check gets one of the best chosen by ours, and vLLM's figure is shown beside ours.
When the two differ by more than the prompts' noise (NOISE_STANDARD_ERRORS of our τ's standard error over
the prompts, workers.contract.acceptance.tau_standard_error), the run page says so (vllm_note).

The trainers mark the lowest validation loss when training ends (workers.stages.train.loop.
lowest_val_loss_epoch): τ is measured later, by the evaluate stage, which measures the marked checkpoint
and every other one with the same prompts and settings. Until that stage succeeded the mark is only
provisional under "tau", and pages say so; best_decide marks the best by τ once it has, and again
whenever a measurement of one of the run's checkpoints lands (runs.pipeline.lifecycle.result_records); a serve
check landing moves nothing.

Only measurements comparable with the run's own count: the evaluate stage's prompts (the held-out
conversations), its number of prompts, new tokens and proposal length. A measurement someone asked for
with other prompts or settings measures something else and is left out of the choice (it still shows on
the checkpoint's page). Runs trained elsewhere report their own checkpoints and have no choice of ours.

Evaluation suites (runs.data.suites): the stage measures every checkpoint on each of the run's suites too,
with the same new tokens, proposal length and number of prompts; `tau_by_suite` holds each ({name: τ}, the
held-out prompts under HELD_OUT). Under "tau" a run's `best_suite` (default HELD_OUT) chooses, or its
`best_suite_weights`, a mix Σ w·τ_suite over the suites it names (a checkpoint missing one of them has no
mix and is not chosen); that figure is the score's `chosen_tau`, the held-out τ stays its `tau`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from django.db import transaction
from django.db.models import Prefetch

from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.jobs.models import ServeCheck
from runs.pipeline.status.list_tau import run_list_tau_refresh
from runs.pipeline.models import PipelineRun, TrainingRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.status.changes import training_changed
from runs.pipeline.launch.setting_bounds import BEST_BY, HELD_OUT

TAU, VAL_LOSS = BEST_BY
# Two τ equal to this many decimals are a tie, as between the runs of a sweep (runs.sweeps.selectors).
TAU_DECIMALS = 3
# vLLM's τ of the best disagrees with ours when it lies further from ours than this many standard errors
# of our τ over the prompts: about 95% of the draws of as many prompts would move τ less (normal
# approximation). The two decode the same prompts, so a difference this large is not the prompts' luck
# but the serving path (its numerics, kernels or counting) yielding another acceptance than ours.
NOISE_STANDARD_ERRORS = 2.0


@dataclass(frozen=True)
class CheckpointScore:
    checkpoint_id: int
    epoch: int
    val_loss: float | None
    tau: float | None  # our τ, measured as the run's evaluate stage measures: what the choice compares
    tau_standard_error: float | None  # of `tau`, over its prompts (None: not kept, or one prompt)
    vllm_tau: float | None  # vLLM's emitted-token τ on the same prompts, where a serve check succeeded: shown
    evaluation: Evaluation | None = field(default=None, compare=False, repr=False)  # where `tau` comes from
    tau_by_suite: dict[str, float] = field(default_factory=dict)  # {suite: τ}, HELD_OUT's being `tau`
    chosen_tau: float | None = None  # what the choice compares: the run's best_suite's τ, or its weighted mix

    @property
    def noise(self) -> float | None:
        """How far from our τ vLLM's may lie before it disagrees (NOISE_STANDARD_ERRORS standard errors)."""
        return None if self.tau_standard_error is None else NOISE_STANDARD_ERRORS * self.tau_standard_error

    @property
    def vllm_disagrees(self) -> bool | None:
        """vLLM's τ further from ours than the prompts' noise; None where either is missing."""
        if self.vllm_tau is None or self.tau is None or self.noise is None:
            return None
        return abs(self.vllm_tau - self.tau) > self.noise


def _loss(score: CheckpointScore) -> float:
    # A diverged validation (NaN) or none at all never wins on loss.
    value = score.val_loss
    return math.inf if value is None or math.isnan(value) else value


def lowest_val_loss(scores: list[CheckpointScore]) -> CheckpointScore | None:
    """The lowest validation loss; the earlier epoch on a tie (the trainers choose the same way)."""
    return min(scores, key=lambda s: (_loss(s), s.epoch), default=None)


def highest_tau(scores: list[CheckpointScore]) -> CheckpointScore | None:
    """The highest τ; on a tie to TAU_DECIMALS the lower validation loss, then the earlier epoch. None
    while no checkpoint is measured."""
    measured = [s for s in scores if s.chosen_tau is not None]
    return min(measured, key=lambda s: (-round(s.chosen_tau, TAU_DECIMALS), _loss(s), s.epoch), default=None)


def run_best_by(run: PipelineRun) -> str | None:
    """The run's rule. A run launched before the setting existed keeps what chose its best then (the
    lowest validation loss); a run trained elsewhere has none of ours (None)."""
    if run.external:
        return None
    return (run.config or {}).get("best_by", VAL_LOSS)


def run_best_suite(run: PipelineRun) -> tuple[str, dict[str, float]]:
    """(the suite whose τ chooses, the weights of a mix: empty unless the run stated one)."""
    config = run.config or {}
    return config.get("best_suite") or HELD_OUT, dict(config.get("best_suite_weights") or {})


def _chosen_tau(tau_by_suite: dict[str, float], suite: str, weights: dict[str, float]) -> float | None:
    if not weights:
        return tau_by_suite.get(suite)
    if any(name not in tau_by_suite for name in weights):
        return None
    return sum(weight * tau_by_suite[name] for name, weight in weights.items())


def suite_measurements(measured: list[Evaluation], names: list[str], stage: Evaluation) -> dict[str, Evaluation]:
    """{suite: measurement}: a checkpoint's latest measurement on each suite made as the stage measures (its new
    tokens, proposal length and number of prompts asked)."""
    found: dict[str, Evaluation] = {}
    for e in measured:  # newest first
        if (e.suite in names and e.suite not in found and e.tau is not None and e.max_new_tokens == stage.max_new_tokens
                and e.num_speculative_tokens == stage.num_speculative_tokens and e.max_prompts == stage.max_prompts):
            found[e.suite] = e
    return found


def _on_suites(measured: list[Evaluation], names: list[str], stage: Evaluation) -> dict[str, float]:
    """{suite: τ} of suite_measurements."""
    return {name: e.tau for name, e in suite_measurements(measured, names, stage).items()}


def _measured_alike(evaluation: Evaluation) -> dict:
    """Filters for measurements comparable with this succeeded one: the same prompts, as many of them,
    the same new tokens per prompt and proposal length (its row holds k and the count as decoded)."""
    return dict(prompts_path=evaluation.prompts_path, max_new_tokens=evaluation.max_new_tokens,
                num_speculative_tokens=evaluation.num_speculative_tokens, num_prompts=evaluation.num_prompts)


def tau_on_the_same_prompts(*, checkpoint_id: int, evaluation: Evaluation | None) -> float | None:
    """Our τ of a checkpoint on an evaluation's prompts and settings: that evaluation's when it measured this
    checkpoint; else, where it measured another checkpoint of the run (a run's serve check of its best by τ
    uses the run's measurement, runs.pipeline.lifecycle.result_records.evaluation_record), the checkpoint's own
    measurement made alike."""
    if evaluation is None or evaluation.checkpoint_id == checkpoint_id:
        return evaluation.tau if evaluation is not None else None
    alike = Evaluation.objects.filter(checkpoint_id=checkpoint_id, status=StageStatus.SUCCEEDED, tau__isnull=False,
                                      **_measured_alike(evaluation))
    return alike.order_by("-id").values_list("tau", flat=True).first()


def checkpoint_run_id(checkpoint_id: int | None) -> int | None:
    """The run that trained the checkpoint (None: imported, or none given)."""
    if checkpoint_id is None:
        return None
    return Checkpoint.objects.filter(pk=checkpoint_id).values_list("training_run__run_id", flat=True).first()


def _measured(checkpoints) -> list[Checkpoint]:
    """The checkpoints with `measured`: their succeeded measurements, newest first (as
    runs.pipeline.selectors.checkpoints_with_tau reads them for the pages)."""
    if isinstance(checkpoints, list):
        return checkpoints
    done = Evaluation.objects.filter(status=StageStatus.SUCCEEDED).order_by("-id")
    return list(checkpoints.prefetch_related(Prefetch("evaluations", queryset=done, to_attr="measured")))


def checkpoint_scores(*, run: PipelineRun, checkpoints: list[Checkpoint] | None = None) -> list[CheckpointScore]:
    """Each of the run's checkpoints with its validation loss, its τ measured like the run's evaluate stage
    measured (none before that stage succeeded) and vLLM's on the same prompts where one was served.
    `checkpoints`: the run's, with `measured` already read (the summary's); else they are read here. One
    query for the serve checks once the stage succeeded."""
    training = getattr(run, "training_run", None)
    if training is None:
        return []
    checkpoints = _measured(Checkpoint.objects.filter(training_run=training) if checkpoints is None else checkpoints)
    stage = None if run.external else getattr(run, "evaluation", None)
    decided = stage is not None and stage.status == StageStatus.SUCCEEDED and stage.tau is not None
    alike = _measured_alike(stage) if decided else {}
    vllm: dict[int, float] = {}
    if decided:
        checks = ServeCheck.objects.filter(checkpoint__training_run=training, status=StageStatus.SUCCEEDED,
                                           vllm_tau_emitted__isnull=False,
                                           evaluation__prompts_path=stage.prompts_path,
                                           **{k: v for k, v in alike.items() if k != "prompts_path"})
        for checkpoint_id, tau in checks.order_by("-id").values_list("checkpoint_id", "vllm_tau_emitted"):
            vllm.setdefault(checkpoint_id, tau)  # the latest
    suite, weights = run_best_suite(run)
    names = list((run.config or {}).get("eval_suites") or {})
    scores = []
    for c in sorted(checkpoints, key=lambda c: c.epoch):
        ours = next((e for e in c.measured if decided and e.tau is not None and not e.suite
                     and all(getattr(e, k) == v for k, v in alike.items())), None)  # the latest alike
        by_suite = {HELD_OUT: ours.tau} if ours else {}
        if decided and names:
            by_suite.update(_on_suites(c.measured, names, stage))
        scores.append(CheckpointScore(checkpoint_id=c.pk, epoch=c.epoch, val_loss=c.val_loss,
                                      tau=ours.tau if ours else None,
                                      tau_standard_error=ours.tau_standard_error if ours else None,
                                      vllm_tau=vllm.get(c.pk), evaluation=ours, tau_by_suite=by_suite,
                                      chosen_tau=_chosen_tau(by_suite, suite, weights)))
    return scores


@dataclass(frozen=True)
class BestChoice:
    by: str | None  # the run's rule (run_best_by)
    by_tau: CheckpointScore | None  # the choice of each rule, whichever the run follows
    by_val_loss: CheckpointScore | None
    provisional: bool  # under "tau" before every checkpoint is measured: the lowest loss stands in
    scores: list[CheckpointScore] = field(default_factory=list, repr=False)
    on: str = HELD_OUT  # what τ chooses, in words: a suite's name, or the mix ("0.5 held_out + 0.5 code")

    @property
    def best(self) -> CheckpointScore | None:
        """The checkpoint the run's rule picks now (the lowest loss while provisional)."""
        if self.by == TAU and not self.provisional:
            return self.by_tau
        return self.by_val_loss if self.by is not None else None


def best_choice(*, run: PipelineRun, scores: list[CheckpointScore]) -> BestChoice:
    by = run_best_by(run)
    by_tau = highest_tau(scores)
    suite, weights = run_best_suite(run)
    on = " + ".join(f"{w:g} {name}" for name, w in weights.items()) if weights else suite
    return BestChoice(by=by, by_tau=by_tau, by_val_loss=lowest_val_loss(scores),
                      provisional=by == TAU and bool(scores) and by_tau is None, scores=scores, on=on)


def best_measurement(evaluation: Evaluation | None, choice: BestChoice) -> Evaluation | None:
    """The measurement a run's acceptance shows: its best's once the best is known, else the evaluate
    stage's own row (`evaluation`), which measured the trainer's choice."""
    chosen = choice.best
    if evaluation is None or chosen is None or chosen.evaluation is None:
        return evaluation
    return chosen.evaluation


def _described(score: CheckpointScore) -> str:
    # Pages count epochs from 1 (a checkpoint's `epoch` is the trainer's index, from 0).
    if score.tau is None:
        loss = "–" if score.val_loss is None else f"{score.val_loss:.4f}"
        return f"epoch {score.epoch + 1} (validation loss {loss})"
    vllm = "" if score.vllm_tau is None else f"; vLLM {score.vllm_tau:.2f}"  # shown beside ours, never chosen by
    return f"epoch {score.epoch + 1} (τ {score.tau:.2f}{vllm})"


def vllm_note(choice: BestChoice) -> str:
    """A sentence for the run page when the best's vLLM τ disagrees with ours beyond the prompts' noise;
    empty otherwise (agreeing, not served, or no standard error to judge by)."""
    chosen = choice.best
    if chosen is None or choice.provisional or not chosen.vllm_disagrees:
        return ""
    prompts = chosen.evaluation.num_prompts if chosen.evaluation is not None else None
    over = f" over its {prompts} prompts" if prompts else ""
    line = (f"vLLM's τ for the best, {chosen.vllm_tau:.2f}, differs from ours, {chosen.tau:.2f}, by "
            f"{chosen.vllm_tau - chosen.tau:+.2f}: more than the prompts' noise (±{chosen.noise:.2f}, "
            f"{NOISE_STANDARD_ERRORS:g} standard errors of our τ{over}).")
    if choice.by == TAU:
        line += (" The best was chosen by our τ, measured on every checkpoint; served by vLLM the checkpoints may "
                 "rank otherwise: serve-check the others from their pages before relying on the choice.")
    return line


def best_text(choice: BestChoice) -> str:
    """One sentence for the run page and run_pipeline: the best, by which rule, and the other rule's
    choice where it differs."""
    if choice.by is None or choice.by_val_loss is None:
        return ""
    lowest = choice.by_val_loss
    if choice.provisional:
        return (f"best so far (provisional): {_described(lowest)}, the lowest validation loss; the best is the "
                "checkpoint with the highest τ, chosen once the evaluate stage has measured every checkpoint.")
    by_tau = choice.by_tau
    if choice.by == TAU and choice.on != HELD_OUT:
        chosen = (f"best by τ on {choice.on}: epoch {by_tau.epoch + 1} (τ {by_tau.chosen_tau:.2f} on {choice.on}"
                  + ("" if by_tau.tau is None else f"; held-out τ {by_tau.tau:.2f}") + ")")
        by_held_out = highest_tau([replace(s, chosen_tau=s.tau) for s in choice.scores])
        if by_held_out is not None and by_held_out.checkpoint_id != by_tau.checkpoint_id:
            chosen += f"; by held-out τ alone: {_described(by_held_out)}"
        return chosen + "."
    if choice.by == TAU:
        if by_tau.checkpoint_id == lowest.checkpoint_id:
            return f"best by τ: {_described(by_tau)}, also the lowest validation loss."
        return f"best by τ: {_described(by_tau)}; lowest validation loss: {_described(lowest)}."
    if by_tau is None or by_tau.checkpoint_id == lowest.checkpoint_id:
        return f"best by lowest validation loss (this run's setting): {_described(lowest)}."
    return (f"best by lowest validation loss (this run's setting): {_described(lowest)}; "
            f"highest τ: {_described(by_tau)}.")


def _score_dict(score: CheckpointScore | None) -> dict | None:
    if score is None:
        return None
    return {"checkpoint_id": score.checkpoint_id, "epoch": score.epoch, "val_loss": score.val_loss,
            "tau": score.tau, "tau_standard_error": score.tau_standard_error, "vllm_tau": score.vllm_tau,
            "chosen_tau": score.chosen_tau, "tau_by_suite": score.tau_by_suite}


def best_dict(choice: BestChoice) -> dict:
    """The summary's `best`: the rule, the checkpoint it picks (our τ, its standard error, vLLM's τ where
    served), whether that is provisional, each rule's choice, the sentence, and whether vLLM's τ of the
    best disagrees with ours beyond the prompts' noise (`vllm_disagrees`, `noise`, `vllm_note`)."""
    none = dict.fromkeys(("checkpoint_id", "epoch", "val_loss", "tau", "tau_standard_error", "vllm_tau", "chosen_tau",
                          "tau_by_suite"))
    chosen = None if choice.provisional else choice.best
    return {"by": choice.by, "on": choice.on, **(_score_dict(choice.best) or none),
            "noise": chosen.noise if chosen else None,
            "vllm_disagrees": chosen.vllm_disagrees if chosen else None, "vllm_note": vllm_note(choice),
            "provisional": choice.provisional, "by_tau": _score_dict(choice.by_tau),
            "by_val_loss": _score_dict(choice.by_val_loss),
            "differ": bool(choice.by_tau and choice.by_val_loss
                           and choice.by_tau.checkpoint_id != choice.by_val_loss.checkpoint_id),
            "text": best_text(choice)}


@transaction.atomic
def best_decide(*, run_id: int | None) -> Checkpoint | None:
    """Mark the run's best checkpoint by its rule (is_best, and the training's best_epoch), once that
    rule can decide; returns the best checkpoint as marked afterwards (None: none marked, or no run). While the
    choice is provisional the trainer's mark stands: the evaluate stage reads it to know which
    checkpoint it measures first, and the others (runs.checkpoints.evaluation)."""
    if run_id is None:
        return None
    run = PipelineRun.objects.filter(pk=run_id).select_related("training_run", "evaluation").first()
    training = getattr(run, "training_run", None) if run is not None else None
    if training is None or run.external:
        return None
    # One decision at a time per run: a serve check and a measurement landing together see each other's.
    marked = list(Checkpoint.objects.select_for_update().filter(training_run=training).order_by("epoch"))
    if training.status != StageStatus.SUCCEEDED:  # a measurement of an epoch while the others still train
        return next((c for c in marked if c.is_best), None)
    choice = best_choice(run=run, scores=checkpoint_scores(run=run))
    best = choice.best
    if best is None or choice.provisional:
        return next((c for c in marked if c.is_best), None)
    moved = [c.pk for c in marked if c.is_best != (c.pk == best.checkpoint_id)]
    if moved:
        Checkpoint.objects.filter(training_run=training).exclude(pk=best.checkpoint_id).update(is_best=False)
        Checkpoint.objects.filter(pk=best.checkpoint_id).update(is_best=True)
        training_changed(training_run_id=training.pk)  # the run's pages show the mark
    if training.best_epoch != best.epoch or training.best_tau != best.tau:
        # Counted by its manager; best_tau is what the lists, sweeps and compare show (PipelineRun.shown_tau).
        TrainingRun.objects.filter(pk=training.pk).update(best_epoch=best.epoch, best_tau=best.tau)
        run_list_tau_refresh(run_id=run.pk)
    return Checkpoint.objects.get(pk=best.checkpoint_id)
