"""τ's standard error over the prompts (workers.contract.acceptance.tau_standard_error), the prompts'
noise the run page judges vLLM's τ of the best against (runs.pipeline.best): known answers worked by hand."""
import math
import statistics

import pytest

from workers.contract.acceptance import tau_from_accepted, tau_standard_error


def test_two_prompts_of_equal_forwards_give_the_sd_of_their_tau_over_root_n():
    # Prompt 0: both forwards accept 3 drafts (τ 4); prompt 1: none (τ 1). Pooled τ 2.5.
    # Residuals 8 - 2.5·2 = 3 and 2 - 2.5·2 = -3: √(2/1 · 18) / 4 = 1.5, which is stdev([4, 1]) / √2.
    accepted = [[3, 3], [0, 0]]
    assert tau_from_accepted([a for p in accepted for a in p], 3)[0] == 2.5
    assert tau_standard_error(accepted) == pytest.approx(1.5)
    assert tau_standard_error(accepted) == pytest.approx(statistics.stdev([4.0, 1.0]) / math.sqrt(2))


def test_prompts_of_unequal_forwards_weigh_by_their_forwards():
    # T = [4, 3], F = [1, 3], τ = 7/4; residuals 4 - 1.75 = 2.25 and 3 - 5.25 = -2.25: √(2 · 10.125) / 4.
    assert tau_standard_error([[3], [0, 0, 0]]) == pytest.approx(1.125)


def test_prompts_that_accept_alike_have_no_noise():
    assert tau_standard_error([[1, 2], [2, 1], [3, 0]]) == 0.0


def test_one_prompt_or_none_has_no_standard_error():
    assert tau_standard_error([[2, 2, 1]]) is None
    assert tau_standard_error([[2, 2, 1], []]) is None  # a prompt with no forward adds nothing to τ
    assert tau_standard_error([]) is None
