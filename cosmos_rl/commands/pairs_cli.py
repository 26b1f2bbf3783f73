"""`cosmos-rl pairs mine`: DPO preference pairs from a model's own rollouts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from cosmos_rl.commands.console import check_device as _check_device, fail as _fail, out, print_json as _json, warn
from cosmos_rl.commands.options import REWARD_TOKEN_ENV_HELP, REWARD_URL_HELP, REWARD_WEIGHT_HELP, checked_path, finite_float, out_path
from cosmos_rl.commands.progress import CommandProgress
from cosmos_rl.core.errors import UserError

pairs_app = typer.Typer(no_args_is_help=True, help="DPO preference pairs (images or clips) from a model's own rollouts.")


@pairs_app.command("mine")
def pairs_mine(
    target: str = typer.Argument(..., help="The model that samples: a run directory (its newest checkpoint, or --step), a diffusers model folder, or preset:NAME."),
    reward: list[str] = typer.Option(..., "--reward", help="The reward that ranks the samples: a built-in one (shapes_partial ranks by partial credit, shapes_strict by all-or-nothing; clips: shapes_video_partial, shapes_video_strict; a world model's forward dynamics on window keys: pusht_forward_partial, pusht_forward_strict; or a weight-free one), a model reward from a local folder (pickscore=FOLDER, clipscore=FOLDER, aesthetic=FOLDER, hps=FOLDER, videoalign=FOLDER), or a --reward-url service's reward; repeat for a weighted sum."),
    reward_url: Optional[str] = typer.Option(None, "--reward-url", help=REWARD_URL_HELP),
    reward_weight: Optional[list[str]] = typer.Option(None, "--reward-weight", help=REWARD_WEIGHT_HELP),
    reward_token_env: Optional[str] = typer.Option(None, "--reward-token-env", help=REWARD_TOKEN_ENV_HELP),
    prompts: Path = typer.Option(..., "--prompts", help="Prompt file (.txt or .jsonl): one pair at most per row (an episode suite's reward: one training-window key per row)."),
    samples: int = typer.Option(4, "--samples", help="Samples per prompt row (K >= 2); the best and the worst make the pair."),
    out_dir: str = typer.Option(..., "--out", help="Folder for pairs-NNNNNN.tar and mine.json (must hold no pairs-*.tar yet)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the samples' noise; another seed mines other samples."),
    batch_size: int = typer.Option(32, "--batch-size", help="Samples per sampler call."),
    per_shard: int = typer.Option(1000, "--per-shard", help="Pairs per shard."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when available), cpu or cuda."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
    sample_steps: Optional[int] = typer.Option(None, "--sample-steps", help="Sampler steps instead of the target's own (a run's \\[rl.eval] or rl.sample_steps, an exported folder's cosmos_rl.json, else 20)."),
    guidance: Optional[float] = typer.Option(None, "--guidance", parser=finite_float, help="Guidance instead of the target's own (a run's \\[rl.eval] or rl.guidance, an exported folder's cosmos_rl.json, else 3.0)."),
    step: Optional[int] = typer.Option(None, "--step", help="A run's committed checkpoint step to use (default: the newest)."),
    frames: Optional[int] = typer.Option(None, "--frames", help="Frames per clip for a bare model (4k + 1; default: a preset's own, else 1 = images): mine clip pairs; a run uses its model.num_frames."),
    image_size: Optional[int] = typer.Option(None, "--image-size", help="A world model's window clips (--reward pusht_forward_partial): the frame size a bare model samples (default: the suite's, 96); a run samples its own."),
    frame_reduce: Optional[str] = typer.Option(None, "--frame-reduce", help="Clips ranked by an image reward: score every frame and reduce (mean, min, first, last)."),
) -> None:
    """Sample K images (or clips) per prompt, score them, write best-vs-worst pairs (ties dropped) as webdataset shards for rl.data.shards."""
    from cosmos_rl.commands.mining.command import run_mine
    from cosmos_rl.commands.run_summary import clock

    _check_device(device)
    started = time.monotonic()
    try:
        with CommandProgress("mining", "prompt rows") as rows:
            summary = run_mine(
                target, reward=reward, prompts=checked_path(prompts, "--prompts"), samples=samples, out_dir=out_path(out_dir), seed=seed,
                batch_size=batch_size, per_shard=per_shard, device=device, warn=warn, sample_steps=sample_steps, guidance=guidance, step=step,
                frames=frames, frame_reduce=frame_reduce, image_size=image_size, progress=lambda done, total: rows("", done, total),
                reward_url=reward_url, reward_weights=reward_weight or (), reward_token_env=reward_token_env,
            )
    except UserError as exc:
        _fail(exc)
    if as_json:
        _json(summary)
        return
    out.print(
        f"[bold green]wrote[/] {summary['pairs']} pairs from {summary['rows']} prompt rows "
        f"({summary['ties_dropped']} tied and dropped) to {len(summary['shards'])} shard(s) in {escape(out_dir)} "
        f"in {clock(time.monotonic() - started)}",
        highlight=False,
    )
    out.print(f"  use them with: rl.data.shards = [\"{escape(out_dir)}/pairs-{{000000..{len(summary['shards']) - 1:06d}}}.tar\"]", highlight=False)
    if summary["frames"] > 1:
        out.print(f"  and model.num_frames = {summary['frames']} (clip pairs)", highlight=False)
    if summary.get("mode"):
        out.print(f"  and [model.condition] kind = \"{summary['mode']}\", source = \"{summary['suite']}\" (frame 0 and the action rows "
                  "rebuilt from each pair's key)", highlight=False)
