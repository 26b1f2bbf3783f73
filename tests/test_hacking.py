"""The reward-hacking watch with hand values: a held-out drop inside its interval is noise and says
nothing, one outside warns; one reward dimension collapsing while the total rises warns, naming
the dimension and the step; `rl.eval.stop_on_hacking` makes the step loop commit and exit 3."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from cosmos_rl.config import load
from cosmos_rl.core.errors import EXIT_HACKING, HackingStopped, exit_code_for
from cosmos_rl.evaluation.during import TrainingEval
from cosmos_rl.evaluation.hacking import Evaluation, HackingWatch, collapsed, fell, score_drop, slope
from cosmos_rl.evaluation.scores import GOLD_KEY, PROMPT_KEY, PromptTotals, gold_metrics

SMOKE = Path(__file__).resolve().parents[1] / "manifests" / "nft_t2i_smoke.toml"

# One task of ten prompts scoring 1, 0, 1, 0, ... (the worked example of evaluation.hacking).
BEFORE = {"counting": (1.0, 0.0) * 5}
ONE_LOST = {"counting": (0.0, 0.0) + (1.0, 0.0) * 4}  # one of the five 1s lost: mean 0.5 -> 0.4
ALL_LOST = {"counting": (0.0,) * 10}  # every 1 lost: mean 0.5 -> 0.0


def test_a_drop_inside_the_interval_is_noise():
    # Differences: nine 0s and one -1; a resample's mean is -k/10, k ~ Binomial(10, 0.1), and
    # P(k = 0) = 0.9^10 ~ 35%, so the 97.5th percentile is 0: the interval reaches 0.
    change, (lo, hi) = score_drop(BEFORE, ONE_LOST)
    assert change == pytest.approx(-0.1) and hi == 0.0 and lo < 0
    assert not fell(BEFORE, ONE_LOST)


def test_a_drop_outside_the_interval_counts():
    # Differences: five -1s and five 0s: k ~ Binomial(10, 1/2), the interval [-0.8, -0.2].
    change, (lo, hi) = score_drop(BEFORE, ALL_LOST)
    assert change == pytest.approx(-0.5) and (lo, hi) == pytest.approx((-0.8, -0.2))
    assert fell(BEFORE, ALL_LOST)


def test_slope_and_collapse_by_hand():
    assert slope([1.0, 0.5, 0.0]) == (pytest.approx(-0.5), (pytest.approx(-0.5), pytest.approx(-0.5)))
    assert collapsed([1.0, 0.5, 0.0])
    # 0.5, 0.3, 0.6: slope +0.05, scatter far larger: not a collapse (not even a fall)
    assert not collapsed([0.5, 0.3, 0.6])
    # a noisy fall: slope -0.1 a step, residuals +0.08/-0.12, standard error 0.04, t(0.975, 3) = 3.18:
    # the interval [-0.227, +0.027] reaches above 0
    b, (lo, hi) = slope([1.0, 0.7, 0.8, 0.5, 0.6])
    assert b == pytest.approx(-0.1) and hi == pytest.approx(-0.1 + 3.1824 * 0.04, abs=1e-4)
    assert not collapsed([1.0, 0.7, 0.8, 0.5, 0.6])
    assert not collapsed([1.0, 0.0])  # two steps: nothing to judge


def _eval(step, signal, prompts, dims=None):
    score = sum(sum(v) / len(v) for v in prompts.values()) / len(prompts)
    return Evaluation(step, tuple(signal), score, prompts, dims or {})


def test_the_watch_ignores_noise_and_warns_on_a_real_drop():
    watch = HackingWatch(2, "train/reward_mean")
    assert watch.observe(_eval(10, [0.2], BEFORE)) == []
    assert watch.observe(_eval(20, [0.4], ONE_LOST)) == []  # the README's kind of drop: inside its noise
    said = HackingWatch(2, "train/reward_mean")
    said.observe(_eval(10, [0.2], BEFORE))
    lines = said.observe(_eval(20, [0.4], ALL_LOST))
    assert len(lines) == 1
    assert "train/reward_mean rose 0.2 -> 0.4 over the last 2 evaluations (steps 10-20) while eval/score fell 0.5 -> 0" in lines[0]
    assert "95% interval [-0.8000, -0.2000]" in lines[0]
    assert said.observe(_eval(30, [0.5], ALL_LOST)) == []  # no drop from 30's oldest (20): cleared, not repeated


def test_one_dimension_collapsing_while_the_total_rises_is_named_with_its_step():
    watch = HackingWatch(3, "train/reward_mean")
    # Steps 1-3, one a evaluation: the total (0.2, 0.3, 0.4) rises while "aesthetic" falls 1.0, 0.5,
    # 0.0 with no scatter; "pickscore" rises; the held-out score holds.
    steps = [(0.2, 0.1, 1.0), (0.3, 0.4, 0.5), (0.4, 0.8, 0.0)]
    said = []
    for step, (total, pick, aes) in enumerate(steps, start=1):
        said.append(watch.observe(_eval(step, [total], BEFORE, {"pickscore": (pick,), "aesthetic": (aes,)})))
    assert said[:2] == [[], []]
    assert len(said[2]) == 1
    line = said[2][0]
    assert "reward dimension 'aesthetic' collapsed at step 3" in line and "1 -> 0" in line
    assert "train/reward_mean rose 0.2 -> 0.4" in line and "pickscore" not in line
    # still collapsing at step 4: no second line for the same occurrence
    assert watch.observe(_eval(4, [0.5], BEFORE, {"pickscore": (0.9,), "aesthetic": (0.0,)})) == []


def test_a_falling_dimension_with_a_falling_total_is_not_hacking():
    watch = HackingWatch(3, "train/reward_mean")
    for step, (total, aes) in enumerate([(0.4, 1.0), (0.3, 0.5), (0.2, 0.0)], start=1):
        lines = watch.observe(_eval(step, [total], BEFORE, {"aesthetic": (aes,)}))
    assert lines == []


def _metrics(prompts, score):
    out = {"eval/score": score}
    for task, values in prompts.items():
        out.update({f"{PROMPT_KEY}{task}/{i}": v for i, v in enumerate(values)})
    return out


def test_training_eval_strips_the_prompt_scores_and_halts_with_stop_on_hacking():
    config = load.load(SMOKE, ["rl.eval.every=1", "rl.eval.hacking_window=2", "rl.eval.stop_on_hacking=true"])
    held = iter([(BEFORE, 0.5), (ONE_LOST, 0.4), (ALL_LOST, 0.0)])
    buffer = io.StringIO()
    hook = TrainingEval(config, lambda step: _metrics(*next(held)), main=True, console=Console(file=buffer, width=400))
    step = hook.wrap_step(lambda s: {"train/reward_mean": 0.1 * s})
    rows = []
    for s in (1, 2):
        rows.append({**step(s), **hook.holdout(s)})
        assert hook.halt() is None  # 0.5 -> 0.4 on these prompts is noise
    rows.append({**step(3), **hook.holdout(3)})
    assert not any(k.startswith(PROMPT_KEY) for row in rows for k in row)  # never written to metrics.jsonl
    assert hook.halt() is not None and hook.halt().startswith("step 3: possible reward hacking")
    assert buffer.getvalue().count("possible reward hacking") == 1


def test_a_rewards_named_dimension_is_watched_as_a_dimension():
    """VideoAlign's motion quality (`train/videoalign.mq/reward_mean`, as the online trainer logs a
    reward's named dimension) collapsing while the total rises warns by its name, one evaluation a step."""
    from cosmos_rl.algorithms.multi_reward import reward_metric_names
    from cosmos_rl.rewards.dimensions import metric_name

    config = load.load(SMOKE, ["rl.eval.every=1", "rl.eval.hacking_window=3"])
    hook = TrainingEval(config, lambda step: _metrics(BEFORE, 0.5), main=False)
    mq, vq = reward_metric_names(metric_name("videoalign", "mq"))[0], reward_metric_names(metric_name("videoalign", "vq"))[0]
    assert mq == "train/videoalign.mq/reward_mean"
    values = {1: (0.2, 1.0, 0.1), 2: (0.3, 0.5, 0.4), 3: (0.4, 0.0, 0.8)}  # total, mq (falls), vq (rises)
    step = hook.wrap_step(lambda s: {"train/reward_mean": values[s][0], mq: values[s][1], vq: values[s][2]})
    for s in (1, 2, 3):
        step(s)
        hook.holdout(s)
    assert len(hook.warnings) == 1 and "reward dimension 'videoalign.mq' collapsed at step 3" in hook.warnings[0]


def test_gold_metrics_by_hand():
    # Two prompts of "counting" and one of "colors", one image each: gold 1, 0 and 1.
    gold = PromptTotals.empty(3)
    for prompt, value in enumerate([1.0, 0.0, 1.0]):
        gold.add(prompt, value, None)
    out = gold_metrics(gold, ["counting", "counting", "colors"])
    assert out["eval/gold"] == pytest.approx(0.75)  # the mean of the task means 0.5 and 1.0
    assert out[f"{GOLD_KEY}counting/1"] == 0.0 and out[f"{GOLD_KEY}colors/0"] == 1.0
    assert out["eval/gold_lo"] <= 0.75 <= out["eval/gold_hi"]


def test_with_a_gold_reward_the_watch_judges_the_gold_score_not_eval_score():
    config = load.load(SMOKE, ["rl.eval.every=1", "rl.eval.hacking_window=2", 'rl.eval.gold="prompt_colour"'])
    # eval/score collapses beyond its noise while the gold reward holds: no warning; then the
    # other way round: a warning naming the gold reward.
    held = iter([(BEFORE, BEFORE), (ALL_LOST, BEFORE), (ALL_LOST, ALL_LOST)])

    def evaluate(step):
        score, gold = next(held)
        out = _metrics(score, sum(score["counting"]) / 10)
        out["eval/gold"] = sum(gold["counting"]) / 10
        out.update({f"{GOLD_KEY}counting/{i}": v for i, v in enumerate(gold["counting"])})
        return out

    hook = TrainingEval(config, evaluate, main=False)
    step = hook.wrap_step(lambda s: {"train/reward_mean": 0.1 * s})
    rows = [{**step(s), **hook.holdout(s)} for s in (1, 2, 3)]
    assert not any(k.startswith(GOLD_KEY) for r in rows for k in r) and all("eval/gold" in r for r in rows)
    assert len(hook.warnings) == 1 and "steps 2-3) while eval/gold (prompt_colour) fell 0.5 -> 0" in hook.warnings[0]


def test_the_loop_commits_then_raises_hacking_stopped(tmp_path):
    from cosmos_rl.trainers.loop import LoopSpec, run_steps

    config = load.load(SMOKE, ["rl.max_steps=5", "checkpoint.every=0", "job.progress=false", f'job.output_dir="{tmp_path}"'])
    spec = LoopSpec(run_dir=tmp_path, start_step=0, resumed=False, main=True, unit="samples", items_per_step=1, progress_fields=())
    evaluated, saved = [], []

    def halt():  # the watch warned at the evaluation after step 2
        return "step 2: possible reward hacking: x" if evaluated and evaluated[-1] >= 2 else None

    with pytest.raises(HackingStopped) as caught:
        run_steps(config, spec, lambda s: {"train/loss": 0.0}, saved.append, lambda: None,
                  holdout_fn=lambda s: evaluated.append(s) or {}, halt=halt)  # fmt: skip
    assert evaluated == [1, 2] and saved == [2] and "after committing step 2" in str(caught.value)
    assert exit_code_for(caught.value) == EXIT_HACKING == 3


# ------------------------------------------------------------ end to end: a planted collapse
class _Planted:
    """A deterministic stand-in reward dimension: every call of step s (one call per played rank)
    scores each image `start + per_step x (s - 1)`, whatever it shows."""

    def __init__(self, start: float, per_step: float, calls_per_step: int):
        self.start, self.per_step, self.calls_per_step, self.calls = start, per_step, calls_per_step, 0

    def __call__(self, images, prompts):
        step = self.calls // self.calls_per_step
        self.calls += 1
        return [self.start + self.per_step * step] * len(prompts)


@pytest.mark.slow  # three NFT steps and evaluations of the tiny model: minutes on 2 shared cores
def test_an_online_run_with_a_collapsing_dimension_warns_and_stops_with_a_commit(tmp_path, monkeypatch):
    """NFT through the real step, evaluation and loop (one process playing the 4 ranks): "rising"
    climbs 0, 1, 2 and "collapsing" falls 1.0, 0.5, 0.0, so the weighted total rises while one
    dimension collapses; with rl.eval.stop_on_hacking the run commits step 3 and ends with exit 3."""
    import json
    import re

    from _nft_local import run_local
    from cosmos_rl.checkpoint import layout
    from cosmos_rl.rewards import registry
    from cosmos_rl.rewards.registry import Reward

    builtin = registry.builtin_rewards
    planted = {"rising": _Planted(0.0, 1.0, 4), "collapsing": _Planted(1.0, -0.5, 4)}
    monkeypatch.setattr(registry, "builtin_rewards", lambda *a: {**builtin(*a), **{
        name: Reward(name, fn, f"{name}:test") for name, fn in planted.items()}})  # fmt: skip
    tables = ('[[rl.rewards]]\nname = "rising"\nweight = 1.0\n\n'
              '[[rl.rewards]]\nname = "collapsing"\nweight = 0.5\n\n')  # fmt: skip
    text = re.sub(r"\[rl\.reward\]\n(?:[^\n]+\n)*", "", SMOKE.read_text(), count=1).replace("[checkpoint]", tables + "[checkpoint]")
    manifest = tmp_path / "planted.toml"
    manifest.write_text(text)
    overrides = ["rl.max_steps=6", "rl.sample_steps=2", "rl.timesteps_per_sample=1", "job.progress=false",
                 "rl.sample_grid_every=0", "checkpoint.every=0", "rl.eval.every=1", "rl.eval.per_task=1",
                 "rl.eval.seeds=1", "rl.eval.sample_steps=2", 'rl.eval.reward="brightness"', "rl.eval.hacking_window=3",
                 'rl.eval.gold="shapes_partial"', "rl.eval.stop_on_hacking=true", f'job.output_dir="{tmp_path}"', 'job.name="run"']  # fmt: skip
    config = load.load(manifest, overrides)
    assert [t.name for t in config.rl.rewards] == ["rising", "collapsing"]
    with pytest.raises(HackingStopped) as caught:
        run_local(config, tmp_path / "run")
    message = str(caught.value)
    assert message.startswith("step 3: possible reward hacking: reward dimension 'collapsing' collapsed at step 3")
    assert "after committing step 3" in message and exit_code_for(caught.value) == 3
    assert layout.latest_committed(layout.checkpoints_root(tmp_path / "run")) == 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["train/collapsing/reward_mean"] for r in rows] == [1.0, 0.5, 0.0]
    assert not any(k.startswith((PROMPT_KEY, GOLD_KEY)) for r in rows for k in r)
    assert all(0.0 <= r["eval/gold_lo"] <= r["eval/gold"] <= r["eval/gold_hi"] <= 1.0 for r in rows)  # the gold reward scored the same samples


def test_the_plan_shows_the_watch_options_only_when_set():
    from cosmos_rl.planning import plan

    on = plan.build(load.load(SMOKE, ["rl.eval.every=1", 'rl.eval.gold="shapes_partial"', "rl.eval.stop_on_hacking=true"]))["eval"]
    assert on["gold"] == "shapes_partial" and on["stop_on_hacking"] == "commit and exit 3 at the first warning"
    assert not {"gold", "stop_on_hacking"} & set(plan.build(load.load(SMOKE, ["rl.eval.every=1"]))["eval"])


def test_the_cli_exits_3_on_hacking_stopped():
    import typer

    from cosmos_rl import cli

    def stopped():
        raise HackingStopped("step 3: possible reward hacking: ...; rl.eval.stop_on_hacking stopped the run after committing step 3")

    with pytest.raises(typer.Exit) as caught:
        cli._run(stopped)
    assert caught.value.exit_code == 3


def test_torchrun_ranks_that_stopped_on_hacking_make_the_launcher_raise_it(tmp_path):
    """DPO under torchrun: each rank records exit 3 (spmd_worker) and the launcher raises HackingStopped."""
    import json

    from cosmos_rl.trainers import spmd_launch

    logs = tmp_path / "logs"
    logs.mkdir()
    message = "step 4: possible reward hacking: ...; rl.eval.stop_on_hacking stopped the run after committing step 4"
    for rank in (0, 1):
        (logs / f"rank{rank}.status").write_text(json.dumps({"code": EXIT_HACKING, "message": message}))
    with pytest.raises(HackingStopped) as caught:
        spmd_launch._raise_for(tmp_path, 3, config_world=2)
    assert str(caught.value) == message
