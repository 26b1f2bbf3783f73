"""Bootstrap intervals over prompts (`evaluation.intervals`) and the per-prompt totals that feed
them (`evaluation.scores`), against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from cosmos_rl.evaluation.intervals import BOOTSTRAP_SEED, RESAMPLES, bootstrap, cell, draws, paired, settings
from cosmos_rl.evaluation.scores import PromptTotals, Totals, difference, with_intervals

HALF = np.array([1.0] * 5 + [0.0] * 5)


def test_ten_prompts_half_passing_give_the_binomial_percentiles():
    """A resample's mean is k/10, k ~ Binomial(10, 1/2). P(k <= 1) = 11/1024 = 1.1% and
    P(k <= 2) = 56/1024 = 5.5%: the 2.5th percentile is 0.2; by symmetry the 97.5th is 0.8. Of 2000
    resamples ~21 fall at or below 0.1 and ~109 at or below 0.2, so the 50th smallest (where the
    2.5th percentile sits) is 0.2 with overwhelming probability, whatever the draws."""
    result = bootstrap({"colours": HALF})
    assert result.tasks["colours"] == pytest.approx((0.2, 0.8))
    assert result.overall == pytest.approx((0.2, 0.8))  # one task: the overall is that task


def test_equal_scores_and_single_prompt_tasks_give_zero_width():
    """Every resample of equal values (or of one prompt) is the same multiset: every mean is equal."""
    result = bootstrap({"counting": np.full(7, 0.5), "single_object": np.array([1.0])})
    assert result.tasks == {"counting": (0.5, 0.5), "single_object": (1.0, 1.0)}
    assert result.overall == (0.75, 0.75)


def test_the_overall_interval_is_stratified_by_task():
    """single_object: one prompt at 1.0 (nothing to resample); colours: the ten half-passing prompts.
    Each resample's overall is (1 + colours mean) / 2, an increasing map of the colours mean, so its
    percentiles are the map of [0.2, 0.8]: [0.6, 0.9]. A bootstrap pooling the eleven prompts would
    instead let single_object's prompt stand in for colours' and give other numbers."""
    result = bootstrap({"single_object": np.array([1.0]), "colours": HALF})
    assert result.tasks["colours"] == pytest.approx((0.2, 0.8))
    assert result.overall == pytest.approx((0.6, 0.9))


def test_draws_are_fixed_by_seed_task_and_count_only():
    a = bootstrap({"position": np.linspace(0, 1, 9), "colours": HALF})
    b = bootstrap({"colours": HALF, "position": np.linspace(0, 1, 9)})
    assert a.tasks == b.tasks  # the order of tasks and the other tasks change no task's draws
    assert bootstrap({"position": np.linspace(0, 1, 9)}).tasks["position"] == a.tasks["position"]
    assert draws("colours", 10).shape == (RESAMPLES, 10) and draws("colours", 10).max() == 9
    assert np.array_equal(draws("colours", 10), draws("colours", 10))
    assert not np.array_equal(draws("colours", 10), draws("counting", 10))
    assert not np.array_equal(draws("colours", 10, seed=BOOTSTRAP_SEED + 1), draws("colours", 10))
    assert settings()["resamples"] == RESAMPLES == 2000 and settings()["seed"] == BOOTSTRAP_SEED == 0


def test_a_paired_difference_where_every_prompt_improves_excludes_zero():
    """Differences 0.1 .. 0.5: every resampled mean lies between the smallest and the largest
    difference, so the interval is inside [0.1, 0.5] and excludes 0."""
    base = np.array([0.0, 0.25, 0.5, 0.0, 0.25])
    policy = base + np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    lo, hi = paired({"counting": policy}, {"counting": base}).tasks["counting"]
    assert 0.1 <= lo < hi <= 0.5


def test_pairing_removes_the_spread_both_models_share():
    """Base scores spread from 0 to 0.75, the checkpoint exactly 0.25 above on every prompt (values
    exact in binary): every resampled difference is 0.25, a zero-width interval, while the two
    unpaired intervals are wide and overlap."""
    base = np.array([0.0, 0.25, 0.5, 0.75, 0.0, 0.5])
    policy = base + 0.25
    assert paired({"position": policy}, {"position": base}).overall == (0.25, 0.25)
    p, b = bootstrap({"position": policy}).overall, bootstrap({"position": base}).overall
    assert p[0] < b[1]  # the unpaired intervals overlap
    with pytest.raises(ValueError, match="same tasks"):
        paired({"a": policy}, {"b": base})


def test_prompt_totals_add_across_ranks_and_attach_intervals():
    """Captions ["a circle", "a square", "two circles"] x 2 seeds; strict scores seed 0: [1, 0, 1],
    seed 1: [1, 0, 0]; partial = strict except "a square" 0.5 under both seeds. Per prompt strict:
    [1, 0, 0.5]; tasks {single_object: mean(1, 0) = 0.5, counting: 0.5}, score 0.5. single_object's
    resamples of (1, 0) have means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: [0, 1]. counting has
    one prompt: [0.5, 0.5]. The overall is (single_object + 0.5) / 2: [0.25, 0.75]."""
    tasks_of = ["single_object", "single_object", "counting"]
    scored = [(0, 1.0, 1.0), (1, 0.0, 0.5), (2, 1.0, 1.0), (0, 1.0, 1.0), (1, 0.0, 0.5), (2, 0.0, 0.0)]
    groups = ("single_object", "counting")
    ranks = [(Totals.empty(groups), PromptTotals.empty(3)), (Totals.empty(groups), PromptTotals.empty(3))]
    for number, (prompt, score, partial) in enumerate(scored):
        totals, prompts = ranks[number % 2]
        totals.add(tasks_of[prompt], score, partial)
        prompts.add(prompt, score, partial)
    totals, prompts = ranks[0][0] + ranks[1][0], ranks[0][1] + ranks[1][1]
    assert PromptTotals.from_dict(prompts.as_dict(), 3) == prompts
    scores = with_intervals(totals.scores("shapes_strict"), prompts, tasks_of)
    assert scores.prompt_scores == {"single_object": (1.0, 0.0), "counting": (0.5,)}
    assert scores.prompt_partials == {"single_object": (1.0, 0.5), "counting": (0.5,)}
    assert scores.intervals.tasks == {"single_object": (0.0, 1.0), "counting": (0.5, 0.5)}
    assert scores.intervals.overall == (0.25, 0.75)
    assert scores.metrics()["eval/score_lo"] == 0.25 and scores.metrics()["eval/score_hi"] == 0.75
    assert {"eval/score_partial_lo", "eval/score_partial_hi"} <= set(scores.metrics())
    # Against itself: every per-prompt difference is 0.
    same = difference(scores, scores)
    assert same.score == 0.0 and same.intervals.overall == (0.0, 0.0) and same.tasks == {"single_object": 0.0, "counting": 0.0}


def test_cells_show_a_value_and_its_bounds():
    assert cell(0.3234, (0.2911, 0.3571)) == "0.323 [0.29, 0.36]"
    assert cell(0.0876, (0.0512, 0.1249), signed=True) == "+0.088 [0.05, 0.12]"
    assert cell(-0.00001, (-0.001, 0.02), signed=True) == "+0.000 [0.00, 0.02]"
    assert cell(-0.031, (-0.09, 0.02), signed=True) == "-0.031 [-0.09, 0.02]"
    assert cell(0.5, None) == "0.500" and cell(None, None) == "n/a"
