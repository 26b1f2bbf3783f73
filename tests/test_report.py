"""`cosmos-rl report` on run directories the tests write: real PNGs, the values written, clear errors."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from _inproc import cosmos
from PIL import Image

from cosmos_rl.commands import report, report_figures

ROOT = Path(__file__).resolve().parent.parent
PLOT_PX = (round(report_figures.FIG_SIZE_IN[0] * report_figures.FIG_DPI), round(report_figures.FIG_SIZE_IN[1] * report_figures.FIG_DPI))


def cli(*args: str):
    """In-process (tests/_inproc.py): these tests read exit codes, words and the files written, not the process."""
    return cosmos(*args, cwd=ROOT)


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def dpo_run(tmp_path: Path) -> Path:
    run = tmp_path / "dpo_run"
    run.mkdir()
    (run / "manifest.toml").write_text((ROOT / "manifests" / "dpo_t2i_smoke.toml").read_text())
    rows = []
    for step in range(1, 31):
        row = {"step": step, "train/loss": 0.7 - 0.01 * step, "train/dpo_accuracy": 0.5 + 0.01 * step,
               "train/dpo_reward_margin": 0.02 * step, "time/train_s": 1.5}
        if step % 10 == 0:  # validation every 10 steps, in the same row as the train metrics
            row.update({"val/loss": 0.72 - 0.004 * step, "val/dpo_accuracy": 0.5 + 0.005 * step})
        rows.append(row)
    rows[14]["train/dpo_accuracy"] = 0.99  # the best accuracy is not the last one
    write_rows(run / "metrics.jsonl", rows)
    for step in (10, 20, 30):
        (run / "checkpoints" / f"step_{step}").mkdir(parents=True)
    for step in (20, 30):  # step_10 was never committed, so the report must not list it
        (run / "checkpoints" / f"step_{step}" / "COMMITTED").write_text("")
    return run


def nft_run(tmp_path: Path) -> Path:
    run = tmp_path / "nft_run"
    (run / "samples").mkdir(parents=True)
    (run / "manifest.toml").write_text((ROOT / "manifests" / "nft_t2i_smoke.toml").read_text())
    names = ("reward_mean", "policy_loss", "kl_loss", "advantage_mean", "optimality_mean", "optimality_second_moment",
             "positive_error", "negative_error")
    rows = [{"step": s, **{f"train/{n}": 0.1 * s + i for i, n in enumerate(names)},
             "train/reward_std": 0.5, "time/rollout_s": 0.6, "time/reward_s": 0.1, "time/train_s": 0.3, "time/orchestration_s": 0.05}
            for s in range(1, 21)]
    rows[-1]["train/kl_loss"] = "nan"  # MetricsWriter keeps a non-finite value as a string
    write_rows(run / "metrics.jsonl", rows)
    for step in (20, 10, 0):  # written out of order; the report orders them by step
        Image.new("RGB", (64, 32), (step * 10, 0, 0)).save(run / "samples" / f"step_{step}.png")
    return run


def test_dpo_report_via_cli(tmp_path):
    run = dpo_run(tmp_path)
    result = cli("report", str(run))
    assert result.returncode == 0, result.stderr
    out = run / "report"
    pngs = sorted((out / "plots").glob("*.png"))
    # train/ and val/ of the same metric share one figure; time/* is one figure.
    assert [p.name for p in pngs] == ["dpo_accuracy.png", "dpo_reward_margin.png", "loss.png", "time.png"]
    for png in pngs:
        with Image.open(png) as image:
            image.verify()
        with Image.open(png) as image:
            assert image.format == "PNG" and image.size == PLOT_PX
            low, high = image.convert("L").getextrema()
            assert high - low > 100, f"{png} is blank"  # axes and lines on a white background
    text = (out / "report.md").read_text()
    assert "| `train/loss` | 0.4 (30) | 0.4 (30) |" in text
    assert "| `train/dpo_accuracy` | 0.8 (30) | 0.99 (15) |" in text
    assert "| `val/dpo_accuracy` | 0.65 (30) | 0.65 (30) |" in text
    for png in pngs:
        assert f"(plots/{png.name})" in text
    assert "`step_20`, `step_30`" in text and "step_10`" not in text
    assert "```toml\n" in text and 'algorithm = "dpo"' in text


def test_nft_report_embeds_sample_grids_in_step_order(tmp_path):
    run = nft_run(tmp_path)
    out = tmp_path / "elsewhere"
    path = report.write_report(run, out)
    assert path == out / "report.md" and not (run / "report").exists()
    text = path.read_text()
    embedded = re.findall(r"!\[samples at step (\d+)\]\(([^)]+)\)", text)
    assert [int(s) for s, _ in embedded] == [0, 10, 20]
    for _, link in embedded:  # relative links resolve from the report's folder to the real grids
        with Image.open(out / link) as image:
            assert image.size == (64, 32)
    names = {p.stem for p in (out / "plots").glob("*.png")}
    assert names == {"reward", "advantage_mean", "loss_terms", "optimality", "branch_errors", "time"}
    for png in (out / "plots").glob("*.png"):
        with Image.open(png) as image:
            assert image.size == PLOT_PX
    assert "| `train/reward_mean` | 2 (20) | 2 (20) |" in text
    assert "| `train/kl_loss` | nan (20) | 2.1 (1) |" in text  # a NaN last value stays visible
    assert "| `train/advantage_mean` | 5 (20) | n/a |" in text
    assert "| `train/reward_std` | 0.5 (20) | n/a |" in text  # a spread has no better direction


def test_repeated_steps_keep_the_last_row(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_rows(path, [{"step": 1, "train/loss": 1.0}, {"step": 2, "train/loss": 0.9}, {"step": 2, "train/loss": 0.5}])
    series = report.read_metrics(path)["train/loss"]
    assert series.steps == (1, 2) and series.values == (1.0, 0.5)


@pytest.mark.parametrize("case", ["no_dir", "no_manifest", "no_metrics", "empty_metrics", "bad_line"])
def test_unusable_run_dir_exits_2_naming_the_file(tmp_path, case):
    run = dpo_run(tmp_path)
    named = run
    if case == "no_dir":
        run = named = tmp_path / "missing"
    elif case == "no_manifest":
        named = run / "manifest.toml"
        named.unlink()
    elif case == "no_metrics":
        named = run / "metrics.jsonl"
        named.unlink()
    elif case == "empty_metrics":
        named = run / "metrics.jsonl"
        named.write_text("\n")
    else:
        named = run / "metrics.jsonl"
        named.write_text('{"step": 1, "train/loss": 0.5}\n{"train/loss": 0.4}\n')
    result = cli("report", str(run))
    assert result.returncode == 2, result.stdout + result.stderr
    assert str(named) in result.stderr and "Traceback" not in result.stderr
    if case == "bad_line":
        assert f"{named}:2" in result.stderr


def test_the_eval_section_shows_intervals_and_the_paired_change(tmp_path):
    """An eval.json with intervals (hand-written numbers) and one written before them: the table
    shows `value [lo, hi]`, the change signed, and n/a where the file has no such number."""
    run = dpo_run(tmp_path)
    (run / "eval").mkdir()
    result = {
        "step": 30, "reward": "shapes_strict", "n_prompts": 2, "seeds": [0], "prompts": "two prompts",
        "score": 0.5, "tasks": {"colours": 0.5}, "base_score": 0.25, "base_tasks": {"colours": 0.25},
        "score_partial": 0.75, "tasks_partial": {"colours": 0.75}, "base_score_partial": None, "base_tasks_partial": None,
        "score_interval": [0.125, 0.875], "tasks_interval": {"colours": [0.125, 0.875]},
        "base_score_interval": [0.0, 0.5], "base_tasks_interval": {"colours": [0.0, 0.5]},
        "diff_score": 0.25, "diff_tasks": {"colours": 0.25}, "diff_score_interval": [-0.25, 0.75], "diff_tasks_interval": {"colours": [-0.25, 0.75]},
        "bootstrap": {"resamples": 2000, "seed": 0},
    }  # fmt: skip
    (run / "eval" / "eval.json").write_text(json.dumps(result))
    text = report.write_report(run).read_text()
    assert "(2000 resamples, seed 0)" in text
    assert "| colours | 0.500 [0.12, 0.88] | 0.250 [0.00, 0.50] | +0.250 [-0.25, 0.75] | 0.750 | n/a | n/a |" in text
    assert "| **overall** | 0.500 [0.12, 0.88] | 0.250 [0.00, 0.50] | +0.250 [-0.25, 0.75] | 0.750 | n/a | n/a |" in text
    older = {key: value for key, value in result.items() if not key.endswith("_interval") and not key.startswith("diff_") and key != "bootstrap"}
    (run / "eval" / "eval.json").write_text(json.dumps(older))
    text = report.write_report(run).read_text()
    assert "| colours | 0.500 | 0.250 | n/a | 0.750 | n/a | n/a |" in text and "resamples" not in text


# ------------------------------------------------------------------------------- video runs
VIDEO_TASKS = ("motion", "two_motions", "static", "colour_change", "counting_motion", "turn")
FRAME_COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255)]  # frame k of every clip is one colour


def solid_clips(frames: int = 5, size: int = 8) -> np.ndarray:
    """uint8 [F, H, W, 3]: frame k filled with FRAME_COLOURS[k], so a GIF frame shows which clip frame it plays."""
    return np.stack([np.full((size, size, 3), FRAME_COLOURS[k], dtype=np.uint8) for k in range(frames)])


def colours_of(image: Image.Image) -> set[tuple[int, int, int]]:
    return {colour for _, colour in image.convert("RGB").getcolors(maxcolors=1 << 16)}


def video_sft_run(tmp_path: Path) -> Path:
    """A hand-written video SFT run: the shipped manifest, eval rows at steps 2 and 4 with every
    moving-shapes task, and what `cosmos-rl eval RUN_DIR` leaves in eval/ for clips (the grid
    module's own writer: frame strips and a GIF)."""
    from cosmos_rl.evaluation.grid import Tile, save_clips

    run = tmp_path / "video_run"
    (run / "eval").mkdir(parents=True)
    (run / "manifest.toml").write_text((ROOT / "manifests" / "sft_video_shapes_cpu.toml").read_text())
    rows = [{"step": s, "train/loss": 0.5 - 0.05 * s} for s in range(1, 5)]
    for row, level in ((rows[1], 0.25), (rows[3], 0.5)):
        row.update({"eval/score": level, "eval/score_lo": level - 0.1, "eval/score_hi": level + 0.1, "eval/score_partial": level + 0.25})
        for k, task in enumerate(VIDEO_TASKS):
            row[f"eval/task/{task}"] = level * k / 5
            row[f"eval/task_partial/{task}"] = level * k / 5 + 0.25
    write_rows(run / "metrics.jsonl", rows)
    clip = solid_clips()
    tiles = [Tile(clip, "a red square moving right", "pass, partial 1.00", True)]
    save_clips(run / "eval" / "before_after.png", [("base", tiles), ("checkpoint\nstep 4", tiles)])
    (run / "eval" / "eval.json").write_text(json.dumps({"step": 4, "reward": "shapes_video_strict", "score": 0.5, "tasks": {"motion": 0.5}}))
    return run


def test_a_video_runs_report_plays_the_eval_clips_and_draws_eval_per_task(tmp_path):
    run = video_sft_run(tmp_path)
    text = report.write_report(run).read_text()
    # The before/after clips: the GIF embedded, above the frame strips.
    gif_link, strip_link = "(../eval/before_after.gif)", "(../eval/before_after.png)"
    assert gif_link in text and strip_link in text and text.index(gif_link) < text.index(strip_link)
    with Image.open(run / "eval" / "before_after.gif") as gif:
        assert gif.format == "GIF" and gif.n_frames == 5 and gif.info["loop"] == 0
        for k in range(5):  # GIF frame k shows every clip's frame k and no other frame's colour
            gif.seek(k)
            seen = colours_of(gif)
            assert FRAME_COLOURS[k] in seen and not seen & (set(FRAME_COLOURS) - {FRAME_COLOURS[k]})
    with Image.open(run / "eval" / "before_after.png") as strips:  # every frame at once
        assert set(FRAME_COLOURS) <= colours_of(strips)
    # One figure for the per-task scores, 6 panels as 2 rows of 3, each 3.2 x 2.4 in at 100 dpi: 960 x 480 px.
    plots = {p.name for p in (run / "report" / "plots").glob("*.png")}
    assert plots == {"eval.png", "eval_task.png", "loss.png"}
    with Image.open(run / "report" / "plots" / "eval_task.png") as image:
        assert image.size == (960, 480)
        low, high = image.convert("L").getextrema()
        assert high - low > 100
    assert "### eval/task" in text and "(plots/eval_task.png)" in text and "One panel per task" in text
    assert "| `eval/task/turn` | 0.5 (4) | 0.5 (4) |" in text  # the table still lists every task's metric


def test_task_panels_pair_each_tasks_score_with_its_partial():
    series = [report_figures.Series("eval/task/motion", (2, 4), (0.0, 0.5)), report_figures.Series("eval/task_partial/motion", (2, 4), (0.25, 0.75)),
              report_figures.Series("eval/task/static", (2, 4), (1.0, 1.0))]  # fmt: skip
    panels = report_figures.task_panels(series)
    assert list(panels) == ["motion", "static"]
    assert panels["motion"] == [report_figures.Series("score", (2, 4), (0.0, 0.5)), report_figures.Series("partial", (2, 4), (0.25, 0.75))]
    assert panels["static"] == [report_figures.Series("score", (2, 4), (1.0, 1.0))]  # a reward without partial scores
    assert report_figures.families([s.name for s in series]) == {"eval/task": [s.name for s in sorted(series, key=lambda s: s.name)]}
    assert report_figures.task_figure_px(1) == (320, 240) and report_figures.task_figure_px(4) == (960, 480)


def test_the_online_sample_grid_of_clips_is_a_gif_and_strips_that_the_report_embeds(tmp_path):
    """save_sample_grid, the online trainers' writer: clips [G=2, rows=1, F, H, W, 3] become
    step_<N>.png (frame strips) and step_<N>.gif; images [G, rows, H, W, 3] one labelled PNG sheet."""
    import torch

    from cosmos_rl.evaluation.grid import save_sample_grid

    run = nft_run(tmp_path)
    clips = torch.from_numpy(np.stack([solid_clips()[None], solid_clips()[None]]))  # [2, 1, 5, 8, 8, 3]
    save_sample_grid(run / "samples" / "step_30.png", clips, ["a red square moving right"], torch.tensor([[1.0, 0.0]]))
    with Image.open(run / "samples" / "step_30.gif") as gif:
        assert gif.n_frames == 5
        gif.seek(2)
        assert FRAME_COLOURS[2] in colours_of(gif) and FRAME_COLOURS[0] not in colours_of(gif)
    images = torch.zeros(2, 1, 4, 4, 3, dtype=torch.uint8)
    images[0] = torch.tensor([255, 0, 0], dtype=torch.uint8)  # rank 0's sample red, rank 1's green
    images[1] = torch.tensor([0, 255, 0], dtype=torch.uint8)
    save_sample_grid(run / "samples" / "step_40.png", images, ["a red square"], torch.tensor([[1.0, 0.0]]))
    assert not (run / "samples" / "step_40.gif").exists()
    with Image.open(run / "samples" / "step_40.png") as grid:
        pixels = np.asarray(grid.convert("RGB"))
    # The two samples side by side, each a 128 px tile (4 px upscaled 32x), red left of green ...
    red, green = [np.argwhere((pixels == colour).all(axis=2)) for colour in ((255, 0, 0), (0, 255, 0))]
    assert len(red) == len(green) == 128 * 128 and red[:, 1].max() < green[:, 1].min()
    # ... with the prompt label on the left and the prompt and reward written under each tile (dark ink).
    ink = (pixels.max(axis=2) < 100)
    assert ink[: red[:, 0].min() + 128, : red[:, 1].min()].any()  # "prompt 1" left of the tiles
    assert ink[red[:, 0].max() + 1 :, red[:, 1].min() : red[:, 1].max() + 1].sum() > 50  # text under the red tile
    assert ink[green[:, 0].max() + 1 :, green[:, 1].min() : green[:, 1].max() + 1].sum() > 50
    text = report.write_report(run).read_text()
    assert "![samples at step 30 (animated)](../samples/step_30.gif)" in text and "![samples at step 30](../samples/step_30.png)" in text
    assert "step 40 (animated)" not in text and "![samples at step 40](../samples/step_40.png)" in text
    assert "each clip plays in the GIF" in text


# ------------------------------------------------------------------- plot order, labels, base line
def test_figures_come_in_reading_order_eval_and_reward_first():
    """Not alphabetical (a flat advantage_mean first): the held-out score, the reward, the losses,
    the other curves by name, then the optimizer's and the timings."""
    nft = ["train/advantage_mean", "train/reward_mean", "train/reward_std", "train/policy_loss", "train/kl_loss", "train/lr",
           "train/grad_norm", "time/rollout_s", "time/train_s", "eval/score", "eval/score_lo", "eval/score_hi",
           "eval/task/counting", "train/optimality_mean", "train/brightness/reward_mean", "train/brightness/reward_std"]  # fmt: skip
    assert list(report_figures.families(nft)) == ["eval", "eval/task", "reward", "train/brightness", "loss_terms", "advantage_mean",
                                          "optimality", "grad_norm", "lr", "time"]  # fmt: skip
    dpo = ["train/loss", "val/loss", "train/dpo_accuracy", "val/dpo_accuracy", "train/dpo_reward_margin", "time/step_s", "train/lr"]
    assert list(report_figures.families(dpo)) == ["loss", "dpo_accuracy", "dpo_reward_margin", "lr", "time"]


@pytest.mark.parametrize("family, label", [
    ("eval", "held-out score"), ("reward", "reward per sample"), ("time", "seconds per step"),
    ("advantage_mean", "advantage mean"), ("train/brightness", "brightness"),
])  # fmt: skip
def test_every_plot_labels_its_y_axis(family, label):
    figure = report_figures.family_figure(family, [report_figures.Series("train/x", (1, 2), (0.5, 0.25))])
    assert figure.axes[0].get_ylabel() == label and figure.axes[0].get_xlabel() == "step"


def _run_with_eval_curve(tmp_path: Path, seeds: int) -> Path:
    """An NFT smoke run evaluated every 10 steps ([rl.eval] defaults: 8 held-out prompts per task,
    2 seeds, shapes_strict, the run's own 8 steps at guidance 1 and shift 3) and the eval.json of
    `cosmos-rl eval RUN_DIR` measured with `seeds` seeds."""
    from cosmos_rl.config import load
    from cosmos_rl.evaluation.prompts import eval_captions
    from cosmos_rl.suites import registry as suites

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    config = load.load(ROOT / "manifests" / "nft_t2i_smoke.toml", ["rl.eval.every=10"])
    (run / "manifest.toml").write_text(load.to_toml(config))
    write_rows(run / "metrics.jsonl", [{"step": s, "train/reward_mean": 0.1 * s, **({"eval/score": 0.3 + 0.01 * s} if s % 10 == 0 else {})}
                                       for s in range(1, 21)])  # fmt: skip
    captions, described = eval_captions(None, 8, suites.get("shapes"))
    (run / "eval" / "eval.json").write_text(json.dumps({
        "kind": "run", "step": 20, "reward": "shapes_strict", "prompts": described, "n_prompts": len(captions),
        "seeds": list(range(seeds)), "image_size": 32, "sampler": {"steps": 8, "shift": 3.0, "guidance": 1.0},
        "score": 0.5, "tasks": {"counting": 0.5}, "base_score": 0.2, "base_tasks": {"counting": 0.2},
    }))  # fmt: skip
    return run


def test_the_base_score_is_a_dashed_line_on_the_eval_curve_when_measured_alike(tmp_path):
    run = _run_with_eval_curve(tmp_path, seeds=2)
    (base, label), note = report.base_line(report.load_run(run))
    assert base == 0.2 and label == "base 0.200 (eval/eval.json)"
    figure = report_figures.family_figure("eval", [report.load_run(run).series["eval/score"]], (base, label))
    dashed = [line for line in figure.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and set(dashed[0].get_ydata()) == {0.2} and dashed[0].get_label() == label
    text = report.write_report(run).read_text()
    assert "The dashed line is the base's score, 0.200, from eval/eval.json" in text
    assert text.index("### eval") < text.index("### reward")


def test_a_base_score_measured_otherwise_is_not_drawn_and_the_report_says_why(tmp_path):
    run = _run_with_eval_curve(tmp_path, seeds=4)
    assert report.base_line(report.load_run(run)) == (
        None, "The base's score in eval/eval.json is not drawn: it was measured otherwise than eval/score "
              "(seeds: [0, 1, 2, 3], the run's [rl.eval] [0, 1]).")
    assert "is not drawn: it was measured otherwise than eval/score" in report.write_report(run).read_text()
