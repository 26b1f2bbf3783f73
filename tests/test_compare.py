"""`cosmos-rl compare` on run directories written by hand (manifest.toml, metrics.jsonl,
eval/eval.json, a DPO run's mine.json): every figure against values worked out in the comments,
the refusals (one line, exit 2), and the table, JSON and PNG it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from cosmos_rl.commands import compare, compare_output
from cosmos_rl.cli import app
from cosmos_rl.core.errors import EXIT_USAGE, UserError

EVAL_SETTINGS = {
    "reward": "shapes_strict", "prompts": "the shapes held-out prompts (all 319)", "n_prompts": 319,
    "seeds": [0, 1, 2, 3, 4, 5, 6, 7], "sampler": {"steps": 10, "shift": 1.0, "guidance": 1.0}, "image_size": 32,
}  # fmt: skip
TASKS = ("counting", "position")
BASE = {"score": 0.2, "tasks": {"counting": 0.1, "position": 0.3}}

NFT_MANIFEST = """
[job]
name = "nft_a"
log_every = 25
[model]
preset = "shapes"
image_size = 32
[rl]
algorithm = "nft"
init_from = "preset:shapes"
group_size = 4
prompts_per_step = 32
sample_steps = 10
guidance = 1.0
[rl.eval]
every = 50
seeds = 4
"""

# DPO evaluates with the NFT run's sampler through [rl.eval] (its own would be 20 steps, CFG 3).
DPO_MANIFEST = """
[job]
name = "dpo_a"
log_every = 10
[model]
preset = "shapes"
image_size = 32
[rl]
algorithm = "dpo"
pairs_per_step = 32
[rl.data]
shards = ["{pairs}/pairs-000000.tar"]
[rl.eval]
every = 20
seeds = 4
sample_steps = 10
guidance = 1.0
"""

SFT_MANIFEST = """
[job]
name = "sft_a"
[model]
preset = "shapes"
image_size = 32
[rl]
algorithm = "sft"
samples_per_step = 64
"""


def write_run(folder: Path, manifest: str, rows: list[dict], final: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.toml").write_text(manifest)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if final is not None:
        (folder / "eval").mkdir()
        (folder / "eval" / "eval.json").write_text(json.dumps(final))
    return folder


def eval_json(step: int, score: float, change: float, task_changes: dict, **settings) -> dict:
    """What `cosmos-rl eval RUN_DIR` writes (the keys compare reads), against BASE."""
    return {
        **EVAL_SETTINGS, **settings, "target": "run", "kind": "run", "step": step,
        "score": score, "score_interval": [score - 0.03, score + 0.03],
        "tasks": {t: BASE["tasks"][t] + task_changes[t] for t in TASKS},
        "tasks_interval": {t: [0.0, 1.0] for t in TASKS},
        "base_score": BASE["score"], "base_tasks": dict(BASE["tasks"]), "base_score_partial": 0.4,
        "diff_score": change, "diff_score_interval": [change - 0.02, change + 0.02],
        "diff_tasks": dict(task_changes), "diff_tasks_interval": {t: [task_changes[t] - 0.05, task_changes[t] + 0.05] for t in TASKS},
    }  # fmt: skip


def nft_run(root: Path, name: str = "nft_a", manifest: str = NFT_MANIFEST, final: dict | None = None) -> Path:
    # Rows every 25 steps; each row's time/* phases add up to the seconds of each of its 25 steps:
    # 4.0, 2.0, 4.0, 2.0 s -> wall-clock 100, 150, 250, 300 s at steps 25, 50, 75, 100.
    timings = {25: (1.0, 0.5, 2.0, 0.5), 50: (0.5, 0.25, 1.0, 0.25), 75: (1.0, 0.5, 2.0, 0.5), 100: (0.5, 0.25, 1.0, 0.25)}
    rows = []
    for step, (rollout, reward, train, orchestration) in timings.items():
        row = {"step": step, "train/loss": 0.1, "time/rollout_s": rollout, "time/reward_s": reward,
               "time/train_s": train, "time/orchestration_s": orchestration}  # fmt: skip
        if step == 50:
            row.update({"eval/score": 0.30, "eval/score_lo": 0.25, "eval/score_hi": 0.35})
        if step == 100:
            row.update({"eval/score": 0.40, "eval/score_lo": 0.34, "eval/score_hi": 0.46})
        rows.append(row)
    if final is None:
        final = eval_json(100, 0.32, 0.12, {"counting": 0.2, "position": -0.05})
    return write_run(root / name, manifest, rows, final)


def dpo_run(root: Path, mine: dict | None = None) -> Path:
    pairs = root / "pairs"
    pairs.mkdir()
    if mine is not None:
        (pairs / "mine.json").write_text(json.dumps(mine))
    # No time/* metrics (DPO writes none): wall-clock n/a. eval/score 0.28 at step 20, 0.33 at 40.
    rows = [{"step": s, "train/loss": 0.5} for s in (10, 20, 30, 40)]
    rows[1]["eval/score"], rows[3]["eval/score"] = 0.28, 0.33
    final = eval_json(40, 0.35, 0.15, {"counting": 0.1, "position": 0.2})
    return write_run(root / "dpo_a", DPO_MANIFEST.replace("{pairs}", str(pairs)), rows, final)


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["compare", *map(str, args)])
    return result.exit_code, result.output


# --------------------------------------------------------------------------------- pure figures
def test_wall_clock_counts_each_row_for_the_steps_since_the_last_one():
    # rows at 10 (3 s a step), 20 (1 s), 25 (no timings), 30 (2 s): 30, 40, then unknown from 25 on.
    assert compare.cumulative_wall_clock([10, 20, 25, 30], {10: 3.0, 20: 1.0, 30: 2.0}) == {10: 30.0, 20: 40.0, 25: None, 30: None}
    assert compare.cumulative_wall_clock([5], {}) == {5: None}


def test_first_reach_takes_the_first_evaluated_step_at_or_over_the_threshold():
    points = [compare.Point(s, v, None, None) for s, v in ((50, 0.29), (100, 0.31), (150, 0.35), (200, 0.30))]
    assert compare.first_reach(points, 0.3).step == 100
    # 0.2 + 0.1 is 0.30000000000000004 in floats: a score of 0.3 reaches it.
    assert compare.first_reach(points[3:], 0.2 + 0.1).step == 200
    assert compare.first_reach(points, 0.36) is None


# ------------------------------------------------------------------------------- the comparison
def test_two_algorithms_on_one_budget(tmp_path):
    nft = nft_run(tmp_path)
    dpo = dpo_run(tmp_path, mine={"rows": 850, "samples": 8, "pairs": 800})
    result = compare.compare([nft, dpo], base_score=0.2, margin=0.1)
    by_name = {r["name"]: r for r in result["runs"]}
    n, d = by_name["nft_a"], by_name["dpo_a"]
    # NFT: 32 prompts x 4 samples = 128 generated a step; 100 steps = 12,800 images, 300 s.
    assert n["images"] == {"per_step": 128, "kind": "generated", "before_step_1": 0, "at_last_step": 12800}
    assert n["wall_s"] == 300.0
    assert [(p["step"], p["images"], p["wall_s"], p["score"], p["lo"], p["hi"]) for p in n["curve"]] == [
        (50, 6400, 150.0, 0.30, 0.25, 0.35), (100, 12800, 300.0, 0.40, 0.34, 0.46)]  # fmt: skip
    # Threshold 0.2 + 0.1: NFT's 0.30 at step 50 reaches it; DPO's 0.28 (step 20) does not, 0.33 (step 40) does.
    assert (n["first_reach"]["step"], n["first_reach"]["images"], n["first_reach"]["wall_s"]) == (50, 6400, 150.0)
    # DPO: 2 x 32 pairs = 64 images seen a step, after 850 rows x 8 samples = 6,800 mined: 6,800 + 40 x 64 = 9,360.
    assert d["images"] == {"per_step": 64, "kind": "seen", "before_step_1": 6800, "at_last_step": 9360}
    assert (d["first_reach"]["step"], d["first_reach"]["images"], d["first_reach"]["wall_s"]) == (40, 6800 + 40 * 64, None)
    assert d["wall_s"] is None and any("wall-clock n/a" in note for note in d["notes"])
    assert (d["last_eval"]["step"], d["best_eval"]["score"]) == (40, 0.33)
    # The final paired changes, per task, from each eval.json; the common base once.
    assert n["final"]["change"] == {"value": 0.12, "interval": [pytest.approx(0.10), pytest.approx(0.14)]}
    assert n["final"]["tasks"]["position"]["change"] == {"value": -0.05, "interval": [pytest.approx(-0.10), pytest.approx(0.0)]}
    assert d["final"]["tasks"]["counting"]["change"]["value"] == 0.1 and d["final"]["step"] == 40
    assert result["final_base"]["score"] == 0.2 and result["threshold"] == pytest.approx(0.3)
    assert result["base"] == {"model": "preset:shapes", "init_from": "preset:shapes", "frames": 1, "size": 32}
    assert result["held_out"]["seeds"] == 4 and result["held_out"]["sample_steps"] == 10


def test_without_mine_json_a_dpo_run_counts_only_the_images_it_trains_on(tmp_path):
    result = compare.compare([dpo_run(tmp_path)])
    run = result["runs"][0]
    assert run["images"]["before_step_1"] == 0 and run["images"]["at_last_step"] == 40 * 64
    assert any("mining of its pairs is not counted" in note for note in run["notes"])
    assert run["first_reach"] is None and result["threshold"] is None  # no --base-score: no threshold


def test_an_sft_run_counts_the_images_it_sees_and_has_no_curve(tmp_path):
    sft = write_run(tmp_path / "sft_a", SFT_MANIFEST, [{"step": 100, "train/loss": 0.1}],
                    eval_json(100, 0.28, 0.08, {"counting": 0.0, "position": 0.1}))  # fmt: skip
    result = compare.compare([nft_run(tmp_path), sft], base_score=0.2)
    sft_json = result["runs"][1]
    assert sft_json["images"]["per_step"] == 64 and sft_json["images"]["at_last_step"] == 6400
    assert sft_json["curve"] == [] and sft_json["first_reach"] is None
    assert any("rl.eval.every = 0" in note for note in sft_json["notes"])


# ----------------------------------------------------------------------------------- refusals
def test_a_folder_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    code, output = cli(nft_run(tmp_path), tmp_path / "empty", "--out", tmp_path / "out")
    assert code == EXIT_USAGE and "not a run directory" in output and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "old, new, named",
    [
        ('init_from = "preset:shapes"', 'init_from = "preset:tiny"', "init_from: 'preset:shapes' in nft_a, 'preset:tiny' in nft_b"),
        ("seeds = 4", "seeds = 8", "seeds: 4 in nft_a, 8 in nft_b"),  # other held-out images
        ("guidance = 1.0", "guidance = 3.0", "guidance: 1.0 in nft_a, 3.0 in nft_b"),  # another evaluation sampler
    ],
)
def test_runs_on_different_bases_or_held_out_settings_are_refused(tmp_path, old, new, named):
    other = NFT_MANIFEST.replace(old, new)
    code, output = cli(nft_run(tmp_path), nft_run(tmp_path, "nft_b", other), "--out", tmp_path / "out")
    assert code == EXIT_USAGE and named in output and "not compared on one footing" in output
    assert not (tmp_path / "out").exists()


def test_eval_json_of_other_settings_or_another_base_is_refused(tmp_path):
    a = nft_run(tmp_path)
    b = nft_run(tmp_path, "nft_b", final={**eval_json(100, 0.3, 0.1, {"counting": 0, "position": 0}), "seeds": [0, 1]})
    code, output = cli(a, b)
    assert code == EXIT_USAGE and "eval.json settings differ" in output and "seeds" in output
    shifted = eval_json(100, 0.3, 0.1, {"counting": 0, "position": 0})
    shifted["base_score"] = 0.25  # the same settings, another base score: not one base
    code, output = cli(a, nft_run(tmp_path, "nft_c", final=shifted))
    assert code == EXIT_USAGE and "base's scores in eval.json differ" in output and "0.25" in output


def test_the_same_run_twice_is_refused(tmp_path):
    run = nft_run(tmp_path)
    code, output = cli(run, run)
    assert code == EXIT_USAGE and "given twice" in output


# ------------------------------------------------------------------------------------- output
def test_the_command_prints_the_tables_and_writes_json_and_png(tmp_path):
    out = tmp_path / "out"
    code, output = cli(nft_run(tmp_path), dpo_run(tmp_path, mine={"rows": 850, "samples": 8}), "--base-score", "0.2", "--out", out)
    assert code == 0, output
    lines = output.splitlines()
    # One column per run: nft_a then dpo_a.
    assert [line.split()[-2:] for line in lines if "first >= 0.300 (base + 0.1): step" in line] == [["50", "40"]]
    assert [line.split()[-2:] for line in lines if "images then" in line] == [["6,400", "9,360"]]
    assert [line.split()[-3:] for line in lines if "wall-clock then" in line] == [["150", "s", "n/a"]]
    assert "+0.120 [0.10, 0.14]" in output and "-0.050 [-0.10, 0.00]" in output  # the paired changes
    written = json.loads((out / "compare.json").read_text())
    assert [r["name"] for r in written["runs"]] == ["nft_a", "dpo_a"]
    with Image.open(out / "compare.png") as png:
        assert png.size == (round(compare.FIG_SIZE_IN[0] * compare.FIG_DPI), round(compare.FIG_SIZE_IN[1] * compare.FIG_DPI))


def test_a_run_keeps_its_colour_in_every_panel(tmp_path):
    """DPO first (no wall-clock), NFT second: NFT is the second colour (C1) on the steps axis, and
    stays C1 on the wall-clock axis, where it is the only run (the axes' own cycle would give it C0),
    and in the bars of the final changes."""
    from matplotlib.colors import to_hex

    result = compare.compare([dpo_run(tmp_path), nft_run(tmp_path)], base_score=0.2)
    steps, _, wall, bars = compare_output.figure(result).axes
    want = to_hex("C1")

    def line(ax, name):
        return to_hex(next(l for l in ax.get_lines() if l.get_label() == name).get_color())

    assert line(steps, "dpo_a") == to_hex("C0") and line(steps, "nft_a") == want
    assert [l.get_label() for l in wall.get_lines() if not l.get_label().startswith("base")] == ["nft_a"]
    assert line(wall, "nft_a") == want
    band = next(c for c in wall.collections if c.get_label() == "nft_a 95% interval")
    assert to_hex(band.get_facecolor()[0], keep_alpha=False) == want
    nft_bars = next(c for c in bars.containers if c.get_label() == "nft_a")
    assert to_hex(nft_bars.patches[0].get_facecolor(), keep_alpha=False) == want


def test_later_runs_are_paired_prompt_by_prompt_against_the_first(tmp_path):
    """Per-prompt scores in eval.json (counting 2 prompts, position 2): nft_b's counting prompts each
    score 0.25 above nft_a's and its position prompts each 0.1 below, so every resample of the
    paired bootstrap has the same means: counting +0.25 [0.25, 0.25], position -0.10 [-0.10, -0.10],
    overall (the mean of the task means) +0.075 [0.075, 0.075]. The values are the scores' differences:
    overall 0.40 - 0.325 = 0.075, counting (0.1 + 0.35) - (0.1 + 0.1) = 0.25."""
    # n_prompts 4: the per-prompt lists hold n_prompts scores in all (commands.eval_result checks it).
    a_final = {**eval_json(100, 0.325, 0.125, {"counting": 0.1, "position": 0.15}, n_prompts=4),
               "prompt_scores": {"counting": [0.0, 0.4], "position": [0.5, 0.4]}}
    b_final = {**eval_json(100, 0.40, 0.20, {"counting": 0.35, "position": 0.05}, n_prompts=4),
               "prompt_scores": {"counting": [0.25, 0.65], "position": [0.4, 0.3]}}  # fmt: skip
    a, b = nft_run(tmp_path, "nft_a", final=a_final), nft_run(tmp_path, "nft_b", final=b_final)
    older = nft_run(tmp_path, "nft_old", final=eval_json(100, 0.3, 0.1, {"counting": 0.1, "position": 0.0}, n_prompts=4))
    result = compare.compare([a, b, older])
    first, second, third = result["runs"]
    assert first["against_first"] is None  # the first run is the reference
    assert third["against_first"] is None  # an eval.json from before per-prompt scores: nothing to pair
    paired = second["against_first"]
    assert paired["against"] == "nft_a"
    assert paired["change"]["value"] == pytest.approx(0.075) and paired["change"]["interval"] == pytest.approx([0.075, 0.075])
    assert paired["tasks"]["counting"]["value"] == pytest.approx(0.25)
    assert paired["tasks"]["counting"]["interval"] == pytest.approx([0.25, 0.25])
    assert paired["tasks"]["position"]["interval"] == pytest.approx([-0.1, -0.1])
    code, output = cli(a, b, "--out", tmp_path / "out")
    assert code == 0, output
    assert "final score minus nft_a's" in output and "+0.250 [0.25, 0.25]" in output and "-0.100 [-0.10, -0.10]" in output


# ------------------------------------------------------------------------------ the base's score
def base_eval(tmp_path: Path, **changes) -> Path:
    """The eval.json `cosmos-rl eval preset:shapes --per-task 8 --seeds 4 --sample-steps 10 --guidance 1`
    writes (the keys compare checks), measured as NFT_MANIFEST's [rl.eval] measures."""
    from cosmos_rl.evaluation.prompts import eval_captions
    from cosmos_rl.suites import registry as suites

    captions, described = eval_captions(None, 8, suites.get("shapes"))
    assert len(captions) == 31  # docs/eval.md: up to 8 per task is 31 held-out prompts
    result = {
        "target": "preset:shapes", "kind": "model", "step": None, "reward": "shapes_strict", "score": 0.2,
        "n_prompts": 31, "seeds": [0, 1, 2, 3], "prompts": described,
        "sampler": {"steps": 10, "shift": 1.0, "guidance": 1.0}, "image_size": 32, **changes,
    }  # fmt: skip
    path = tmp_path / "base_eval.json"
    path.write_text(json.dumps(result))
    return path


def test_the_base_score_comes_checked_from_the_base_models_eval_json(tmp_path):
    result = compare.compare([nft_run(tmp_path)], base_eval=base_eval(tmp_path, score=0.25))
    # 0.25 + 0.1: the step-50 0.30 falls short, the step-100 0.40 reaches it (12,800 images, 300 s).
    assert result["base_score"] == 0.25 and result["base_score_from"] == str(tmp_path / "base_eval.json")
    assert result["runs"][0]["first_reach"] == {"step": 100, "score": 0.40, "images": 12800, "wall_s": 300.0, "lo": 0.34, "hi": 0.46}


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"seeds": [0, 1]}, "seeds: [0, 1], the runs' [rl.eval] [0, 1, 2, 3]"),
        ({"sampler": {"steps": 20, "shift": 1.0, "guidance": 3.0}}, "sampler steps: 20, the runs' [rl.eval] 10"),
        ({"target": "preset:tiny"}, "evaluates 'preset:tiny', but the runs start from 'preset:shapes'"),
        ({"kind": "run"}, "not the eval.json of `cosmos-rl eval MODEL`"),
    ],
)
def test_a_base_eval_json_measured_otherwise_is_refused(tmp_path, changes, named):
    code, output = cli(nft_run(tmp_path), "--base-eval", base_eval(tmp_path, **changes), "--out", tmp_path / "out")
    assert code == EXIT_USAGE and named in output, output
    code, output = cli(nft_run(tmp_path, "nft_b"), "--base-eval", base_eval(tmp_path), "--base-score", "0.2")
    assert code == EXIT_USAGE and "pass one" in output


def test_a_zero_width_interval_a_rounding_error_past_its_value_still_draws(tmp_path):
    # One prompt per task: lo == hi == the change, but 0.3 - 0.2 = 0.09999999999999998 < 0.1.
    final = eval_json(100, 0.3, 0.1, {"counting": 0.1, "position": 0.0})
    final["diff_tasks_interval"] = {"counting": [0.3 - 0.2, 0.3 - 0.2], "position": [0.0, 0.0]}
    final["diff_tasks"]["counting"] = 0.1
    compare_output.write(compare.compare([nft_run(tmp_path, final=final)]), tmp_path / "out")
    assert (tmp_path / "out" / "compare.png").is_file()


def test_a_run_name_with_brackets_prints_verbatim(tmp_path):
    code, output = cli(nft_run(tmp_path, "exp[bold]a[x]"), "--out", tmp_path / "out")
    assert code == 0 and "exp[bold]a[x]" in output and "the runs' [rl.eval])" in output


@pytest.mark.parametrize("text, expected", [
    ("{rows: 1", "not valid JSON"),          # malformed: the bounded reader's parse error, the file named
    ("[1, 2]", "not the summary"),           # JSON, but not the object pairs mine writes
    ('{"rows": -1, "samples": 8}', "must be counts"),
])
def test_a_damaged_mine_json_is_refused_naming_it(tmp_path, text, expected):
    run = dpo_run(tmp_path, mine={"rows": 1, "samples": 1})
    (tmp_path / "pairs" / "mine.json").write_text(text)
    with pytest.raises(UserError, match=expected) as caught:
        compare.compare([run])
    assert "mine.json" in str(caught.value)
