"""`cosmos-rl eval` and `[rl.eval]`: the fixed items, the scores, the rank split, the reward-hacking
watch, the command on a preset, and an NFT run (the one-process group) that evaluates while it
trains, is evaluated afterwards against its base, and is reported."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import pytest
from _inproc import cosmos
from rich.console import Console

from cosmos_rl.config import load
from cosmos_rl.core import schema
from cosmos_rl.core.errors import UserError
from cosmos_rl.evaluation.during import TrainingEval
from cosmos_rl.models.build import build_preset
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.evaluation.prompts import held_out_captions, make_items, overlap, rank_share, spread
from cosmos_rl.evaluation.scores import PROMPT_KEY, Totals, caption_groups, groups_of
from cosmos_rl.shapes import TASKS, parse_caption, render, split_prompts
from cosmos_rl.suites import registry as suites

SHAPES = suites.get("shapes")
GROUPS = groups_of(SHAPES)

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "nft_t2i_smoke.toml"
# The smallest evaluation that still covers every task: one prompt of each, one seed.
SMALL = {"per_task": 1, "seeds": 1}


# ------------------------------------------------------------------------------------ items
def test_spread_items_and_rank_shares_follow_the_worked_examples():
    assert spread(list(range(10)), 3) == [1, 5, 8]
    assert spread("abc", 1) == ["b"] and spread("abc", 0) == list("abc") and spread("abc", 5) == list("abc")
    items = make_items(["a", "b"], 2)
    assert [(i.index, i.caption, i.seed) for i in items] == [(0, "a", 0), (1, "b", 0), (2, "a", 1), (3, "b", 1)]
    five = make_items(["a", "b", "c", "d", "e"], 1)
    assert [(i.index, counts) for i, counts in rank_share(five, 0, 2)] == [(0, True), (2, True), (4, True)]
    assert [(i.index, counts) for i, counts in rank_share(five, 1, 2)] == [(1, True), (3, True), (0, False)]


def test_the_default_prompts_are_a_fixed_balanced_held_out_subset():
    captions = held_out_captions(SHAPES, 8)
    assert captions == held_out_captions(SHAPES, 8)
    per_task = {task: sum(parse_caption(c).task == task for c in captions) for task in TASKS}
    # Seed 0 holds out 1, 2, 8, 4, 250 and 54 prompts of the six tasks (docs/shapes.md).
    assert per_task == {"single_object": 1, "two_objects": 2, "counting": 8, "colours": 4, "position": 8, "colour_attribution": 8}
    assert len(held_out_captions(SHAPES, 0)) == 319
    assert not overlap(split_prompts(0).train_captions(), held_out_captions(SHAPES, 0), SHAPES)
    # A rewording of a training prompt counts as seen.
    assert overlap(["a square and a circle"], ["a circle and a square", "a red circle"], SHAPES) == ["a circle and a square"]


def test_a_shapes_reward_refuses_a_caption_outside_the_world_naming_the_prompt():
    with pytest.raises(UserError, match=r"--prompts p.txt: prompt 2: caption 'a cat'"):
        caption_groups(["a red circle", "a cat"], "shapes_strict", "--prompts p.txt", SHAPES)
    assert caption_groups(["a red circle", "a cat"], "brightness", "x", SHAPES) == {"a red circle": "colours", "a cat": "other"}


# ----------------------------------------------------------------------------------- scores
def test_totals_give_the_worked_example_and_add_across_ranks():
    rank0, rank1 = Totals.empty(GROUPS), Totals.empty(GROUPS)
    rank0.add("single_object", 1.0, 1.0)  # "a circle"
    rank1.add("single_object", 0.0, 0.5)  # "a square"
    rank1.add("counting", 1.0, 1.0)  # "two circles"
    both = Totals.from_dict({k: a + b for (k, a), b in zip(rank0.as_dict().items(), rank1.as_dict().values())}, GROUPS)
    assert both == rank0 + rank1
    scores = both.scores("shapes_strict")
    assert scores.tasks == {"single_object": 0.5, "counting": 1.0} and scores.score == 0.75
    assert scores.tasks_partial == {"single_object": 0.75, "counting": 1.0} and scores.score_partial == 0.875
    assert scores.metrics() == {
        "eval/score": 0.75, "eval/score_partial": 0.875, "eval/task/single_object": 0.5, "eval/task/counting": 1.0,
        "eval/task_partial/single_object": 0.75, "eval/task_partial/counting": 1.0,
    }  # fmt: skip
    plain = both.scores("brightness")
    assert plain.score_partial is None and "eval/score_partial" not in plain.metrics()


class _GroundTruth:
    """Stands in for a model: seed 0 draws the caption exactly (verifier: 1), seed 1 draws nothing (0)."""

    def __init__(self):
        from cosmos_rl.evaluation.evaluator import Evaluator
        from cosmos_rl.config.sampler import default_settings

        vae = SimpleNamespace(config=SimpleNamespace(scale_factor_spatial=4))
        self.evaluator = Evaluator(held_out_captions(SHAPES, 1), 2, "shapes_strict", default_settings(), tokenizer=None, vae=vae,
                                   media=MediaSpec.image(32), latent_shape=(4, 1, 8, 8), device=None)  # fmt: skip
        self.evaluator.sample = self.sample
        self.calls: list[int] = []

    def sample(self, transformer, items):
        self.calls.append(len(items))
        blank = np.zeros((32, 32, 3), np.uint8)
        return np.stack([render(parse_caption(i.caption), i.index) if i.seed == 0 else blank for i in items])


def test_ranks_sharing_the_items_give_the_scores_of_one_process():
    truth = _GroundTruth()
    whole, kept = truth.evaluator.totals(None, keep=frozenset({0, 7}))
    assert sorted(kept) == [0, 7]
    expected = {task: 0.5 for task in TASKS}  # half the images drawn right, half blank
    assert whole.scores("shapes_strict").tasks == expected and whole.scores("shapes_strict").tasks_partial == expected
    shares = [truth.evaluator.totals(None, rank, 5)[0] for rank in range(5)]
    assert truth.calls[1:] == [3] * 5  # 12 items over 5 ranks: every rank samples 3 (padded), so FSDP forwards line up
    assert sum(shares, Totals.empty(GROUPS)) == whole
    # Per prompt too: each prompt's two seeds (one drawn right, one blank) average 0.5, on any rank split.
    prompt_shares = [truth.evaluator.scored(None, rank, 5).prompts for rank in range(5)]
    summed = prompt_shares[0]
    for share in prompt_shares[1:]:
        summed = summed + share
    assert summed == truth.evaluator.scored(None).prompts
    assert summed.by_task(truth.evaluator.tasks_of(), "score") == {task: (0.5,) for task in TASKS}


# ---------------------------------------------------------------------------------- hacking
def test_training_eval_adds_eval_rows_on_its_steps_and_warns_once():
    config = load.load(SMOKE, ["rl.eval.every=2", "rl.eval.hacking_window=2"])
    # One task of ten prompts: 1,0,1,0,... (0.5), then every 1 lost (0.0, beyond the noise), then 0.0 again.
    held = iter([(1.0, 0.0) * 5, (0.0,) * 10, (0.0,) * 10])

    def evaluate(step):
        values = next(held)
        return {"eval/score": sum(values) / 10, **{f"{PROMPT_KEY}counting/{i}": v for i, v in enumerate(values)}}

    buffer = io.StringIO()
    hook = TrainingEval(config, evaluate, main=True, console=Console(file=buffer, width=300))
    step = hook.wrap_step(lambda s: {"train/reward_mean": 0.1 * s})
    rows = []
    for s in range(1, 7):
        rows.append({**step(s), **hook.holdout(s)})
    assert [("eval/score" in r) for r in rows] == [False, True, False, True, False, True]
    assert not any(k.startswith(PROMPT_KEY) for r in rows for k in r)
    # The watch gets the signal of every step since the previous evaluation.
    assert [e.signal for e in hook.watch.seen] == [pytest.approx((0.1, 0.2)), pytest.approx((0.3, 0.4)), pytest.approx((0.5, 0.6))]
    assert len(hook.warnings) == 1 and buffer.getvalue().count("possible reward hacking") == 1
    assert "step 4:" in buffer.getvalue()


# ---------------------------------------------------------------------------------- command
def test_eval_preset_json_prints_the_documented_object(tmp_path):
    # In-process (tests/_inproc.py): the JSON and the files written are the subject, not the process.
    result = cosmos("eval", "preset:tiny", "--suite", "shapes", "--json", "--per-task", "1", "--seeds", "1", "--out", tmp_path, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["kind"] == "model" and out["base_score"] is None and out["step"] is None
    assert out["n_prompts"] == 6 and out["seeds"] == [0] and out["n_images"] == 6 and out["reward"] == "shapes_strict"
    assert set(out["tasks"]) == set(TASKS) and 0.0 <= out["score"] <= 1.0 and 0.0 <= out["score_partial"] <= 1.0
    # NFT's schema defaults; the shift is unset there, so the preset's own scheduler gives it
    tiny_shift = float(build_preset("tiny", 0).scheduler.config["flow_shift"])
    assert out["sampler"] == {"steps": 20, "shift": tiny_shift, "guidance": 3.0}
    assert Path(out["grid"]) == tmp_path / "samples.png" and json.loads((tmp_path / "eval.json").read_text()) == out
    # One prompt per task: nothing to resample, so every interval has zero width at its score.
    assert out["score_interval"] == pytest.approx([out["score"]] * 2)
    assert out["tasks_interval"] == {t: [v, v] for t, v in out["tasks"].items()}
    assert out["tasks_partial_interval"] == {t: [v, v] for t, v in out["tasks_partial"].items()}
    assert out["base_score_interval"] is None and out["diff_score"] is None and out["diff_tasks_interval"] is None
    assert out["bootstrap"]["resamples"] == 2000 and out["bootstrap"]["seed"] == 0


def test_eval_sampler_flags_replace_the_targets_own_settings(tmp_path):
    from cosmos_rl.commands.evaluate import run_eval

    own = run_eval("preset:tiny", suite="shapes", per_task=1, seeds=1, out_dir=tmp_path / "own")
    other = run_eval("preset:tiny", suite="shapes", per_task=1, seeds=1, out_dir=tmp_path / "other", sample_steps=4, guidance=1.0)
    assert other["sampler"] == {**own["sampler"], "steps": 4, "guidance": 1.0}
    assert other["score_partial"] != own["score_partial"] or other["tasks_partial"] != own["tasks_partial"] or \
        (tmp_path / "other" / "samples.png").read_bytes() != (tmp_path / "own" / "samples.png").read_bytes()
    with pytest.raises(UserError, match="--sample-steps: must be >= 1"):
        run_eval("preset:tiny", sample_steps=0)
    with pytest.raises(UserError, match="--guidance: must be >= 0"):
        run_eval("preset:tiny", guidance=-1.0)


def test_eval_refuses_bad_options_and_targets_naming_them(tmp_path):
    from cosmos_rl.commands.evaluate import run_eval

    with pytest.raises(UserError, match="--seeds: must be >= 1"):
        run_eval("preset:tiny", seeds=0)
    with pytest.raises(UserError, match="--reward: 'pickscor' is not a built-in"):
        run_eval("preset:tiny", suite="shapes", reward="pickscor")
    with pytest.raises(UserError, match="--reward pickscore: a model reward needs its weights; pass --reward pickscore=FOLDER"):
        run_eval("preset:tiny", suite="shapes", reward="pickscore")
    with pytest.raises(UserError, match="TARGET 'preset:tiny': a model that names no suite to evaluate in; pass --suite NAME"):
        run_eval("preset:tiny", out_dir=tmp_path)
    with pytest.raises(UserError, match="--suite 'nope': unknown suite 'nope'; use one of shapes, shapes_video"):
        run_eval("preset:tiny", suite="nope", out_dir=tmp_path)
    with pytest.raises(UserError, match="--reward shapes_video_strict: a reward of the suite shapes_video, and --suite names shapes"):
        run_eval("preset:tiny", suite="shapes", reward="shapes_video_strict", out_dir=tmp_path)
    with pytest.raises(UserError, match=r"suite shapes_video: judges clips \(9 frames\), and preset:tiny makes images \(1 frame\)"):
        run_eval("preset:tiny", suite="shapes_video", out_dir=tmp_path)
    with pytest.raises(UserError, match="unknown preset 'huge'"):
        run_eval("preset:huge", out_dir=tmp_path)
    with pytest.raises(UserError, match="neither a run directory"):
        run_eval(str(tmp_path), out_dir=tmp_path)


def test_a_run_target_is_refused_before_any_model_loads_or_any_file_is_written(tmp_path, monkeypatch):
    """eval and pairs mine judge a run once (`open_target`), before `Target.load` and before their --out."""
    import shutil

    from cosmos_rl.evaluation import target
    from cosmos_rl.commands.evaluate import run_eval
    from cosmos_rl.commands.mining.command import run_mine

    def no_load(self, device):
        raise AssertionError("a refused target was loaded")

    monkeypatch.setattr(target.Target, "load", no_load)
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "old_runs" / "nft_lora", run)  # committed: step 2
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\n")
    mine = {"reward": "shapes_strict", "prompts": prompts, "samples": 2}
    with pytest.raises(UserError, match=r"--image-size 64: the run .* trains at model\.image_size = 32; drop --image-size"):
        run_eval(str(run), image_size=64, out_dir=tmp_path / "e")
    with pytest.raises(UserError, match=r"--step 5: .* no committed checkpoint at that step; committed: 2$"):
        run_eval(str(run), step=5, out_dir=tmp_path / "e")
    with pytest.raises(UserError, match=r"--step 5: .* committed: 2$"):
        run_mine(str(run), step=5, out_dir=tmp_path / "m", **mine)
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(UserError, match="no committed checkpoint yet"):
        run_mine(str(run), out_dir=tmp_path / "m", **mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.txt", "run"]


# ------------------------------------------------------------------------- an NFT run with eval
@pytest.fixture(scope="module")
def nft_run(tmp_path_factory):
    """Two NFT steps of the smoke manifest in one process, evaluated after each (brightness, so the
    numbers move with the weights), with the manifest.toml a real run directory holds."""
    from _nft_local import run_local

    root = tmp_path_factory.mktemp("eval_run")
    overrides = ["rl.sample_steps=6", "rl.timesteps_per_sample=2", "job.progress=false", "rl.max_steps=2",
                 "rl.sample_grid_every=0", "rl.eval.every=1", "rl.eval.per_task=1", "rl.eval.seeds=1",
                 'rl.eval.reward="brightness"', f'job.output_dir="{root}"', 'job.name="run"']  # fmt: skip
    config = load.load(SMOKE, overrides)
    run_dir = root / "run"
    rows = run_local(config, run_dir)
    (run_dir / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    return run_dir, rows


def test_an_nft_run_writes_eval_rows(nft_run):
    _, rows = nft_run
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert 0.0 < row["eval/score"] < 1.0
        assert {f"eval/task/{t}" for t in TASKS} <= set(row) and "eval/score_partial" not in row
        # One prompt per task: a zero-width interval at the score; no partial one without the verifier.
        assert row["eval/score_lo"] == pytest.approx(row["eval/score"]) == row["eval/score_hi"]
        assert "eval/score_partial_lo" not in row
    assert rows[0]["eval/score"] != rows[1]["eval/score"]  # the policy moved between the evaluations


def test_eval_of_the_finished_run_matches_its_last_eval_row_and_differs_from_its_base(nft_run):
    from cosmos_rl.commands.evaluate import run_eval

    run_dir, rows = nft_run
    first = run_eval(str(run_dir), reward="brightness", **SMALL)
    second = run_eval(str(run_dir), reward="brightness", **SMALL)
    assert first == second  # two calls, identical numbers (the intervals too)
    assert first["kind"] == "run" and first["step"] == 2
    # The checkpoint holds the policy the run evaluated at its last step (batched differently, so
    # equal to the rounding of the uint8 pixels), and the base is the network with adapters off.
    assert first["score"] == pytest.approx(rows[-1]["eval/score"], abs=1e-3)
    assert first["base_score"] is not None and first["base_score"] != first["score"]
    # The paired change: the two scores' difference; one prompt per task, so a zero-width interval.
    assert first["diff_score"] == first["score"] - first["base_score"]
    assert first["diff_tasks"] == {t: v - first["base_tasks"][t] for t, v in first["tasks"].items()}
    assert first["diff_score_interval"] == pytest.approx([first["diff_score"]] * 2, abs=1e-12)
    assert first["base_tasks_interval"] == {t: [v, v] for t, v in first["base_tasks"].items()}
    # Per-prompt scores, what compare pairs runs on: one prompt per task, so each task's one entry is its score.
    assert first["prompt_scores"] == {t: [v] for t, v in first["tasks"].items()}
    assert first["base_prompt_scores"] == {t: [v] for t, v in first["base_tasks"].items()}
    assert first["prompt_partials"] is None and first["base_prompt_partials"] is None  # brightness: no partial score
    from PIL import Image

    with Image.open(run_dir / "eval" / "before_after.png") as grid:
        # six prompts (one per task), base above policy, each 32 px image shown at 128 px with text under it
        assert grid.width > 6 * 128 and grid.height > 2 * 128


def test_eval_into_a_log_prints_progress_lines_and_a_closing_summary(nft_run, tmp_path):
    """Output to files (no terminal): stderr gets a plain progress line at the first and the last
    sampler call of the checkpoint's images, stdout the tables and the closing summary (scores,
    files written, what to run next)."""
    run_dir, _ = nft_run
    out = tmp_path / "eval"
    # In-process (tests/_inproc.py): CliRunner's stdout and stderr are files, not a terminal, as a log is.
    result = cosmos("eval", run_dir, "--reward", "brightness", "--per-task", "1", "--seeds", "1", "--batch-size", "2",
                    "--device", "cpu", "--out", out, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("eval: checkpoint step 2: ")]
    assert lines[0].startswith("eval: checkpoint step 2: 2 of 6 images (") and lines[-1].startswith("eval: checkpoint step 2: 6 of 6 images (")
    assert "eta 0:00:00)" in lines[-1]
    summary = result.stdout[result.stdout.index("done: eval of"):].splitlines()
    assert summary[0].startswith(f"done: eval of {run_dir} in ") and ", base " in summary[0] and ", change " in summary[0]
    assert summary[1] == f"  wrote: {out / 'eval.json'}, {out / 'before_after.png'}"
    assert summary[3].startswith(f"    cosmos-rl report {run_dir}    #") and summary[4].startswith(f"    cosmos-rl export {run_dir} --out models/run")


def test_an_exported_nft_run_samples_what_its_checkpoint_samples(nft_run, tmp_path):
    """The folder carries the run's rollout shift (the smoke manifest's 3.0) and the merged adapter."""
    from cosmos_rl.commands.evaluate import run_eval
    from cosmos_rl.commands.export import export_run

    run_dir, _ = nft_run
    summary = export_run(str(run_dir), tmp_path / "model")
    assert summary["sampler"] == {"steps": 6, "shift": 3.0, "guidance": 1.0} and summary["lora_merged"]
    scheduler = json.loads((tmp_path / "model" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["flow_shift"] == 3.0
    exported = run_eval(str(tmp_path / "model"), suite="shapes", reward="brightness", image_size=32, sample_steps=6, guidance=1.0,
                        out_dir=tmp_path / "e", device="cpu", **SMALL)  # fmt: skip
    assert exported["sampler"] == summary["sampler"]
    assert exported["score"] == pytest.approx(nft_run[1][-1]["eval/score"], abs=1e-3)


def test_report_plots_eval_and_shows_the_before_after_grid(nft_run):
    from cosmos_rl.commands.evaluate import run_eval
    from cosmos_rl.commands.report import write_report

    run_dir, _ = nft_run
    if not (run_dir / "eval" / "eval.json").is_file():
        run_eval(str(run_dir), reward="brightness", **SMALL)
    report = write_report(run_dir)
    plots = {p.name for p in (report.parent / "plots").glob("*.png")}
    assert {"eval.png", "eval_task.png"} <= plots
    text = report.read_text()
    assert "## Evaluation" in text and "](../eval/before_after.png)" in text
    assert "| `eval/score` |" in text and "| **overall** |" in text
    assert "| `eval/score_lo` |" in text and "95% bootstrap interval over prompts (2000 resamples, seed 0)" in text
    result = json.loads((run_dir / "eval" / "eval.json").read_text())
    score = f"{result['score']:.3f} [{result['score_interval'][0]:.2f}, {result['score_interval'][1]:.2f}]"
    assert f"| **overall** | {score} | " in text


def test_compare_reads_a_real_run_directory(nft_run, tmp_path):
    """`cosmos-rl compare` on what a run and `cosmos-rl eval` really write: the curve is the eval/
    rows, wall-clock the running sum of each row's time/* phases (one row a step here), the final
    change eval.json's."""
    from cosmos_rl.commands import compare, compare_output
    from cosmos_rl.commands.evaluate import run_eval

    run_dir, rows = nft_run
    if not (run_dir / "eval" / "eval.json").is_file():
        run_eval(str(run_dir), reward="brightness", **SMALL)
    final = json.loads((run_dir / "eval" / "eval.json").read_text())
    config = load.load(run_dir / "manifest.toml", saved_run=True)
    # base + margin = the step-2 score: reached at step 1 if step 1 scored at least as much, else at 2.
    result = compare.compare([run_dir], base_score=rows[1]["eval/score"] - 0.1, margin=0.1)
    run = result["runs"][0]
    per_step = config.rl.group_size * config.rl.prompts_per_step
    seconds = [sum(v for k, v in row.items() if k.startswith("time/")) for row in rows]
    assert [(p["step"], p["score"], p["images"]) for p in run["curve"]] == [(r["step"], r["eval/score"], r["step"] * per_step) for r in rows]
    assert [p["wall_s"] for p in run["curve"]] == pytest.approx([seconds[0], seconds[0] + seconds[1]])
    assert run["first_reach"]["step"] == (1 if rows[0]["eval/score"] >= rows[1]["eval/score"] else 2)
    assert run["final"]["change"]["value"] == final["diff_score"] and run["final"]["step"] == 2
    assert result["final_base"]["score"] == final["base_score"]
    compare_output.write(result, tmp_path)
    assert (tmp_path / "compare.png").is_file() and json.loads((tmp_path / "compare.json").read_text()) == json.loads(json.dumps(result))


def test_eval_config_defaults_are_off_and_not_part_of_the_run_identity():
    from cosmos_rl.planning import plan

    config = load.load(SMOKE)
    assert config.rl.eval == schema.EvalConfig() and config.rl.eval.every == 0
    evaluated = load.load(SMOKE, ["rl.eval.every=10", "rl.eval.seeds=4"])
    assert plan.run_identity(evaluated) == plan.run_identity(config)
    assert plan.build(config)["eval"] == "off"
    assert plan.build(evaluated)["eval"] == {"every": 10, "prompts": "shapes held-out prompts, up to 8 per task", "seeds": 4,
                                             "reward": "shapes_strict", "hacking_window": 3, "sampler": "8 steps, guidance 1"}  # fmt: skip
    resampled = load.load(SMOKE, ["rl.eval.every=10", "rl.eval.sample_steps=4", "rl.eval.guidance=2.5"])
    assert plan.run_identity(resampled) == plan.run_identity(config)
    assert plan.build(resampled)["eval"]["sampler"] == "4 steps, guidance 2.5"


def test_evaluating_changes_nothing_the_run_computes(nft_run, tmp_path):
    """The same two steps without [rl.eval] give the same training numbers exactly."""
    from _nft_local import run_local

    _, rows = nft_run
    overrides = ["rl.sample_steps=6", "rl.timesteps_per_sample=2", "job.progress=false", "rl.max_steps=2",
                 "rl.sample_grid_every=0", f'job.output_dir="{tmp_path}"', 'job.name="plain"']  # fmt: skip
    plain = run_local(load.load(SMOKE, overrides), tmp_path / "plain")
    for with_eval, without in zip(rows, plain, strict=True):
        train = {k: v for k, v in without.items() if k.startswith("train/")}
        assert train and {k: with_eval[k] for k in train} == train


def test_a_dpo_full_fine_tune_evaluates_while_training_and_against_its_frozen_base(tmp_path):
    """DPO in one process, every weight trained: eval/ rows, then `cosmos-rl eval` of the run loads
    all weights and compares them with the frozen copy of the base."""
    from cosmos_rl.commands.evaluate import run_eval
    from cosmos_rl.trainers.dpo import DPOTrainer

    raw = {
        "job": {"output_dir": str(tmp_path), "name": "dpo", "progress": False},
        "model": {"preset": "tiny", "lora": {"rank": 0}},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": {"algorithm": "dpo", "max_steps": 2, "pairs_per_step": 2, "optimizer": {"lr": 1e-2},
               "data": {"synthetic_pairs": 8}, "eval": {"every": 2, "per_task": 1, "seeds": 1, "reward": "brightness"}},
    }  # fmt: skip
    config = load.structure(raw)
    run_dir = tmp_path / "dpo"
    import torch

    rows = DPOTrainer(config, run_dir, torch.device("cpu")).run()
    assert [("eval/score" in r) for r in rows] == [False, True]
    (run_dir / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    result = run_eval(str(run_dir), reward="brightness", **SMALL)
    tiny_shift = float(build_preset("tiny", 0).scheduler.config["flow_shift"])
    assert result["sampler"] == {"steps": 20, "shift": tiny_shift, "guidance": 3.0}  # DPO has no sampler: the defaults
    assert result["score"] == pytest.approx(rows[-1]["eval/score"], abs=1e-3)
    assert result["base_score"] != result["score"]


def test_prompts_are_tokenized_with_the_models_own_template():
    """The shapes base was trained on the `minimal` template: evaluating it with the pipeline's chat
    template would score a model fed prompts it never saw (measured: strict 0.01 instead of ~0.4)."""
    from cosmos_rl.evaluation.evaluator import Evaluator
    from cosmos_rl.config.sampler import default_settings
    from cosmos_rl.models.text import model_prompt_ids

    tiny = build_preset("tiny", 0)
    minimal = SimpleNamespace(scheduler=tiny.scheduler, prompt_template="minimal")
    captions = ["a red circle"]
    for parts, template in ((minimal, "minimal"), (tiny, "chat")):
        evaluator = Evaluator(captions, 1, "shapes_strict", default_settings(), tokenizer=tiny.tokenizer, vae=tiny.vae,
                              media=MediaSpec.image(32), latent_shape=(4, 1, 8, 8), device=torch.device("cpu"), model_parts=parts)
        cond, uncond = model_prompt_ids(tiny.tokenizer, template, captions, MediaSpec.image(32))
        got = evaluator._ids("a red circle")
        assert got[0].tolist() == cond[0].tolist() and got[1].tolist() == uncond[0].tolist()
    assert len(model_prompt_ids(tiny.tokenizer, "minimal", captions, MediaSpec.image(32))[0][0]) < len(cond[0])
