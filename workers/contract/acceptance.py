"""Acceptance-length arithmetic shared by the evaluate stage and the pages (no torch here)."""
from __future__ import annotations


def cond_accuracies(metrics: dict) -> list[float]:
    """cond_acc_0, cond_acc_1, ... from a metrics dict, in TTT-step order, stopping at the first gap."""
    accs: list[float] = []
    while f"cond_acc_{len(accs)}" in metrics:
        accs.append(float(metrics[f"cond_acc_{len(accs)}"]))
    return accs


def simulated_tau(cond_acc: list[float]) -> float | None:
    """Acceptance length implied by per-step conditional accuracies: 1 + sum_k prod_{j<=k} cond_acc_j.

    Step k's conditional accuracy is measured on tokens whose earlier steps were all right, so the
    product is the chance that a chain's first k+1 drafted tokens are all accepted."""
    if not cond_acc:
        return None
    tau, chain = 1.0, 1.0
    for acc in cond_acc:
        chain *= acc
        tau += chain
    return tau


def tau_from_accepted(accepted: list[int], k: int) -> tuple[float, list[float]]:
    """(tau, acceptance per draft position) from accepted draft tokens per verification forward."""
    if not accepted:
        return 1.0, [0.0] * k
    forwards = len(accepted)
    per_position = [sum(a > i for a in accepted) / forwards for i in range(k)]
    return sum(a + 1 for a in accepted) / forwards, per_position


def tau_standard_error(accepted_per_prompt: list[list[int]]) -> float | None:
    """The standard error of τ over the prompts it was measured on: how far τ would typically move
    with another draw of as many prompts like these (the prompts' noise). None under two prompts.

    τ pools every verification forward, Σ_i T_i / Σ_i F_i (T_i: the tokens prompt i's F_i forwards
    emitted), so a prompt is a cluster of forwards, not one observation each: the ratio estimator's
    standard error over clusters, √(n/(n−1) · Σ_i (T_i − τ·F_i)²) / Σ_i F_i. With equal forwards per
    prompt it is the familiar sd(τ_i)/√n of the prompts' own τ."""
    prompts = [a for a in accepted_per_prompt if a]
    n = len(prompts)
    if n < 2:
        return None
    emitted = [sum(a + 1 for a in accepted) for accepted in prompts]
    forwards = [len(accepted) for accepted in prompts]
    tau = sum(emitted) / sum(forwards)
    spread = sum((t - tau * f) ** 2 for t, f in zip(emitted, forwards)) * n / (n - 1)
    return spread ** 0.5 / sum(forwards)


def evaluation_phases(k_beyond: int) -> int:
    """Passes over the prompts an evaluation makes: the measurement, then the k table's probes (none when
    k_beyond < 0, EAGLE3WEB_K_BEYOND_TRAINED). Its progress counts prompts x passes, so a page does not say
    done while the probes run, and the ETA of a stage to come counts its units the same way."""
    return 2 if k_beyond >= 0 else 1
