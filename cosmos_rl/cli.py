"""The `cosmos-rl` command line: parse, call, map exceptions to exit codes. Nothing else lives here.

Exit codes: 0 done; 2 invalid usage or manifest; 1 runtime failure; 3 stopped by the reward-hacking
watch (rl.eval.stop_on_hacking); 75 stopped by SIGTERM/SIGUSR1
after committing a checkpoint (requeue, then `resume --exact`). Heavy libraries (torch, ray,
diffusers) are imported only by the commands that run models.
"""

from __future__ import annotations

import enum
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from cosmos_rl.commands.console import check_device as _check_device, err, fail as _fail, out, print_json as _json, warn
from cosmos_rl.commands.options import REWARD_TOKEN_ENV_HELP, REWARD_URL_HELP, REWARD_WEIGHT_HELP, checked_path, finite_float, out_path
from cosmos_rl.commands.pairs_cli import pairs_app
from cosmos_rl.commands.progress import CommandProgress
from cosmos_rl.commands.reward_cli import reward_app
from cosmos_rl.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REQUEUE, EXIT_USAGE, UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Post-train Cosmos3 flow models with Diffusion-DPO, DiffusionNFT, Flow-GRPO or SFT, on images and video: text to image, text to video and image to video.",
)
app.add_typer(reward_app, name="reward")
app.add_typer(pairs_app, name="pairs")


def _print_version(value: bool) -> None:
    if value:
        from cosmos_rl import __version__

        print(f"cosmos-rl {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
) -> None:
    pass  # the options of `cosmos-rl` itself; every command is a subcommand


OVERRIDES = typer.Argument(
    None, help="KEY=VALUE overrides with TOML values, e.g. rl.max_steps=5 'job.name=\"x\"' (a string's TOML quotes inside shell quotes).",
    show_default=False,
)


class DataCheck(str, enum.Enum):
    """How much of the data `validate` reads (cosmos_rl.data.scan)."""

    sample = "sample"
    all = "all"
    none = "none"


def _checked(manifest: Path, overrides: list[str], data: DataCheck = DataCheck.none):
    """Load + preflight (+ the data pass unless `data` is none); returns (config, warnings, data notes)
    or raises ManifestError listing every problem."""
    from cosmos_rl.config import load
    from cosmos_rl.core.problems import ManifestError

    config, problems = load.load_all_problems(manifest, overrides)
    notes: list[str] = []
    if config is not None and data is not DataCheck.none:
        from cosmos_rl.config.algorithms import check_data

        found, notes = check_data(config, Path(manifest).resolve().parent, full=data is DataCheck.all)
        problems = problems + found
    if config is None or any(p.severity == "error" for p in problems):
        raise ManifestError(problems, str(manifest))
    return config, [p for p in problems if p.severity != "error"], notes


def _check_machine(config, manifest: Path) -> None:
    """Refuse a run this machine cannot host (a GPU manifest without GPUs) before anything starts."""
    from cosmos_rl.config.preflight import machine_problems
    from cosmos_rl.core.problems import ManifestError

    gpus = 0
    if config.grid.device != "cpu":
        import torch

        gpus = torch.cuda.device_count()
    problems = machine_problems(config, gpus)
    if problems:
        raise ManifestError(problems, str(manifest))


def _print_warnings(warnings) -> None:
    for w in warnings:
        err.print("[yellow]warning[/]: ", end="", highlight=False)
        err.print(w.render(), markup=False, highlight=False)


@app.command()
def validate(
    manifest: Path = typer.Argument(..., help="Run manifest (TOML)."),
    overrides: Optional[List[str]] = OVERRIDES,
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object instead of text."),
    data: DataCheck = typer.Option(
        DataCheck.sample, "--data",
        help="Read the data files too: every row, and the images of a fixed sample of rows (sample), of every row (all), or nothing (none).",
    ),
) -> None:
    """Check a manifest, every preflight rule and the data it names; print OK and a summary, or every problem (exit 2)."""
    from cosmos_rl.core.problems import ManifestError

    try:
        config, warnings, notes = _checked(manifest, overrides or [], data)
    except ManifestError as exc:
        if as_json:
            _json({"ok": False, "problems": [p.as_json() for p in exc.problems]})
            raise typer.Exit(EXIT_USAGE)
        _fail(exc)
    except UserError as exc:
        _fail(exc)
    from cosmos_rl.planning import plan as plan_mod

    resolved = plan_mod.build(config, str(manifest), overrides or [], memory=False)
    summary = {k: resolved[k] for k in ("algorithm", "backend", "world_size", "max_steps", "run_dir", "identity")}
    if as_json:
        _json({"ok": True, "warnings": [w.as_json() for w in warnings], "summary": summary, "data": notes})
        return
    _print_warnings(warnings)
    out.print(f"[bold green]OK[/] {escape(str(manifest))}", highlight=False)
    for key, value in summary.items():
        out.print(f"  {key:<11} {value}", highlight=False, markup=False)
    for note in notes:
        out.print(f"  {'data':<11} {note}", highlight=False, markup=False)


@app.command()
def plan(
    manifest: Path = typer.Argument(..., help="Run manifest (TOML)."),
    overrides: Optional[List[str]] = OVERRIDES,
    as_json: bool = typer.Option(False, "--json", help="Print the resolved plan as JSON."),
) -> None:
    """Show exactly what a run will launch: topology, per-step work, sampler, reward, checkpoints, command."""
    from cosmos_rl.planning import plan as plan_mod

    try:
        config, warnings, _ = _checked(manifest, overrides or [])
    except UserError as exc:
        _fail(exc)
    resolved = plan_mod.build(config, str(manifest), overrides or [])
    if as_json:
        _json(resolved)
        return
    _print_warnings(warnings)
    from cosmos_rl.planning.render import render_plan

    render_plan(out, resolved)


def _summary_line(line: str) -> None:
    """A closing summary line on stdout, plain (paths and metric names are outside text), flushed:
    a log written while the run goes on shows it at once."""
    print(line, flush=True)


def _run(action) -> None:
    """Run a training action, mapping failures to exit codes with one clear line."""
    from cosmos_rl.core.errors import EXIT_HACKING, HackingStopped, Preempted, RunFailed

    try:
        code = action()
    except UserError as exc:
        _fail(exc)
    except Preempted as exc:
        err.print(f"[yellow]stopped[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_REQUEUE)
    except HackingStopped as exc:
        err.print(f"[yellow]stopped[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_HACKING)
    except KeyboardInterrupt:
        err.print("[red]interrupted[/]")
        raise typer.Exit(130)
    except RunFailed as exc:
        err.print(f"[bold red]failed[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(code or EXIT_OK)


@app.command(context_settings={"ignore_unknown_options": False})
def train(
    manifest: Path = typer.Argument(..., help="Run manifest (TOML)."),
    overrides: Optional[List[str]] = OVERRIDES,
) -> None:
    """Validate the manifest, then run it: DPO and SFT under torchrun (or as Ray actors), NFT and GRPO on a Ray actor group; images or clips (T2I, T2V, I2V)."""
    try:
        config, warnings, _ = _checked(manifest, overrides or [])
        _check_machine(config, manifest)
    except UserError as exc:
        _fail(exc)
    _print_warnings(warnings)
    from cosmos_rl.commands import launch

    _run(lambda: launch.train(config, manifest, console=err, summary=_summary_line))


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="Run directory (holds manifest.toml and checkpoints/)."),
    overrides: Optional[List[str]] = OVERRIDES,
    exact: bool = typer.Option(False, "--exact", help="Refuse any change to identity fields or world size."),
) -> None:
    """Continue a run (DPO, NFT, GRPO or SFT) from its newest committed checkpoint."""
    from cosmos_rl.commands import launch

    _run(lambda: launch.resume(run_dir, overrides or [], exact=exact, console=err, summary=_summary_line))


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="Run directory (holds manifest.toml and metrics.jsonl)."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Folder for the report; default RUN_DIR/report."),
) -> None:
    """Plot a run's metric curves and write report.md (final values, plots, sample grids, manifest)."""
    from cosmos_rl.commands.report import write_report

    try:
        path = write_report(run_dir, out_path(out_dir))
    except UserError as exc:
        _fail(exc)
    out.print(f"[bold green]wrote[/] {escape(str(path))}", highlight=False)


@app.command()
def compare(
    run_dirs: List[Path] = typer.Argument(..., help="Run directories (each holds manifest.toml and metrics.jsonl) of runs from one base."),
    out_dir: str = typer.Option("compare", "--out", help="Folder for compare.json and compare.png."),
    base_eval: Optional[Path] = typer.Option(None, "--base-eval", help="The eval.json of `cosmos-rl eval BASE` with the runs' \\[rl.eval] settings (checked): its score is the base of 'first step to base + margin'."),
    base_score: Optional[float] = typer.Option(None, "--base-score", help="Instead of --base-eval: the base's score under the runs' \\[rl.eval] settings, taken as given."),
    margin: float = typer.Option(0.1, "--margin", help="The gain over --base-score whose first evaluated step is reported."),
) -> None:
    """Put runs side by side: held-out eval/score against steps, images and wall-clock, and eval.json's paired changes per task."""
    from cosmos_rl.commands import compare as compare_mod
    from cosmos_rl.commands import compare_output

    try:
        where = out_path(out_dir)  # '' refused before anything is read
        result = compare_mod.compare(run_dirs, base_score=base_score, base_eval=base_eval, margin=margin)
        files = compare_output.write(result, where)
    except UserError as exc:
        _fail(exc)
    compare_output.render(out, result, files)


def _eval_condition(condition: Optional[str], i2v: bool) -> Optional[str]:
    """`--condition`, with the deprecated `--i2v` read as `--condition first_frame`."""
    if not i2v:
        return condition
    if condition not in (None, "first_frame"):
        _fail(UserError(f"--i2v: means --condition first_frame, and --condition {condition} is given too; keep --condition alone"))
    print("note: --i2v is deprecated: write --condition first_frame", file=sys.stderr)
    return "first_frame"


@app.command("eval")
def evaluate(
    target: str = typer.Argument(..., help="A run directory (its newest checkpoint, or --step, vs its base), a diffusers model folder, or preset:NAME."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="Prompt file (.txt or .jsonl), every prompt in order; default: the suite's held-out prompts."),
    seeds: int = typer.Option(2, "--seeds", help="Seeds per prompt (0 .. N-1), the same on every call."),
    per_task: int = typer.Option(8, "--per-task", help="Held-out default only: at most this many prompts per task, evenly spread; 0 = all (319 for shapes)."),
    suite: Optional[str] = typer.Option(None, "--suite", help="The suite (world) to evaluate in: shapes, shapes_video, or package.module:SUITE. Default: the one --reward names, else the run's (rl.eval.suite, else the suite of its rewards), else a preset's own; a model folder needs --suite or --reward."),
    reward: Optional[list[str]] = typer.Option(None, "--reward", help="One of the suite's rewards (its verifier, both scores: shapes_strict or shapes_partial; for video shapes_video_strict or shapes_video_partial; an outside suite's package.module:SUITE/NAME), or for images a built-in weight-free one; or a model reward from a local folder (pickscore=FOLDER, clipscore=FOLDER, aesthetic=FOLDER, hps=FOLDER, videoalign=FOLDER), or a --reward-url service's reward; repeat for a weighted sum. Default: the suite's verifier's strict score."),
    reward_url: Optional[str] = typer.Option(None, "--reward-url", help=REWARD_URL_HELP),
    reward_weight: Optional[list[str]] = typer.Option(None, "--reward-weight", help=REWARD_WEIGHT_HELP),
    reward_token_env: Optional[str] = typer.Option(None, "--reward-token-env", help=REWARD_TOKEN_ENV_HELP),
    batch_size: int = typer.Option(32, "--batch-size", help="Samples per sampler call."),
    image_size: Optional[int] = typer.Option(None, "--image-size", help="Image side for a bare model (default 32); a run uses its model.image_size."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Folder for the grid and eval.json; default RUN_DIR/eval, or eval/NAME for a model."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when available), cpu or cuda."),
    sample_steps: Optional[int] = typer.Option(None, "--sample-steps", help="Sampler steps instead of the target's own (a run's \\[rl.eval] or rl.sample_steps, an exported folder's cosmos_rl.json, else 20)."),
    guidance: Optional[float] = typer.Option(None, "--guidance", parser=finite_float, help="Guidance instead of the target's own (a run's \\[rl.eval] or rl.guidance, an exported folder's cosmos_rl.json, else 3.0)."),
    step: Optional[int] = typer.Option(None, "--step", help="A run's committed checkpoint step to use (default: the newest)."),
    frames: Optional[int] = typer.Option(None, "--frames", help="Frames per clip for a bare model (4k + 1; default: a preset's own, else 1 = images); a run uses its model.num_frames."),
    condition: Optional[str] = typer.Option(None, "--condition", help="Video: what every clip is given: first_frame (the first frame of its caption's ground-truth clip: image to video) or none; in an episode suite (pusht) the mode: forward_dynamics, inverse_dynamics, policy or first_frame (continuation); default: a run's \\[model.condition], a model's none."),
    i2v: bool = typer.Option(False, "--i2v", help="Deprecated: --condition first_frame."),
    data: Optional[Path] = typer.Option(None, "--data", help="An episode suite (pusht) only: a LeRobot dataset folder whose episodes are the held-out windows (one per episode), instead of the suite's own split."),
    closed_loop: bool = typer.Option(False, "--closed-loop", help="pusht with --condition policy: the model acts in the simulator from held-out initial states (--per-task of them, 0 = all 50) x --seeds, receding horizon, scored by success rate and mean max coverage (docs/world.md, \"Closed-loop evaluation\")."),
    execute: Optional[int] = typer.Option(None, "--execute", help="--closed-loop: the actions of each generated chunk executed before the next is generated (1 .. chunk; default half the chunk)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="--closed-loop: the step budget of an episode (default 300, gym-pusht's own); an episode also ends at success (coverage > 0.95)."),
    base: Optional[str] = typer.Option(None, "--base", help="--closed-loop: the model (a run directory, a model folder or preset:NAME) the target is compared with, paired on identical noise; default: a run's own base, none for a model."),
) -> None:
    """Score a run's newest checkpoint and its base (or a model) on held-out prompts x fixed seeds, images or clips (T2I, T2V, or I2V: a run's own \\[model.condition], or --condition first_frame); write a sample grid."""
    from cosmos_rl.commands.evaluate import render, run_eval

    _check_device(device)
    notes: list[str] = []
    started = time.monotonic()
    try:
        with CommandProgress("eval", "images") as progress:
            result = run_eval(
                target, prompts=checked_path(prompts, "--prompts"), seeds=seeds, per_task=per_task, reward=reward, batch_size=batch_size,
                image_size=image_size, out_dir=out_path(out_dir), device=device, warn=warn, sample_steps=sample_steps, guidance=guidance,
                step=step, frames=frames, condition=_eval_condition(condition, i2v), note=notes.append, progress=progress, suite=suite,
                data=data, reward_url=reward_url, reward_weights=reward_weight or (), reward_token_env=reward_token_env,
                closed_loop=closed_loop, execute=execute, max_steps=max_steps, base=base,
            )
    except UserError as exc:
        _fail(exc)
    if as_json:
        _json(result)
    else:
        render(out, result)
    for line in notes:  # images sampled and reused: on stderr, so --json's stdout stays one object
        err.print(line, markup=False, highlight=False)
    if not as_json:
        from cosmos_rl.commands.evaluate import closing_lines

        for line in closing_lines(target, result, time.monotonic() - started):
            out.print(line, markup=False, highlight=False)


@app.command("export")
def export(
    run_dir: str = typer.Argument(..., help="A run directory (the folder `cosmos-rl train` created)."),
    out_dir: str = typer.Option(..., "--out", help="New folder for the model (diffusers pipeline layout); must not exist or be empty."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
    step: Optional[int] = typer.Option(None, "--step", help="A run's committed checkpoint step to use (default: the newest)."),
) -> None:
    """Write a run's committed checkpoint (the newest by default) as a diffusers model folder (LoRA merged in)."""
    from cosmos_rl.commands.export import export_run

    started = time.monotonic()

    def progress(line: str) -> None:  # each stage, with the seconds so far: a log shows where the time goes
        err.print(f"export: {line} ({time.monotonic() - started:.0f} s)", markup=False, highlight=False)

    from cosmos_rl.core.errors import Preempted

    try:
        summary = export_run(run_dir, out_path(out_dir), step=step, progress=progress)
    except UserError as exc:
        _fail(exc)
    except Preempted as exc:  # SIGTERM/SIGINT mid-write: nothing left behind; run it again
        err.print(f"[yellow]stopped[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_REQUEUE)
    if as_json:
        _json(summary)
        return
    out.print(f"[bold green]exported[/] step {summary['step']} of {escape(run_dir)} ({summary['trained']}) to {escape(out_dir)} "
              f"in {time.monotonic() - started:.0f} s", highlight=False)  # fmt: skip
    out.print(f"  use it with: model.path = \"{escape(out_dir)}\"  or  cosmos-rl eval {escape(out_dir)}", highlight=False)


def main() -> None:
    try:
        app()
    except UserError as exc:  # raised outside a command body (should not happen, but never a traceback)
        err.print(str(exc), markup=False)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
