"""Build the `shapes` preset with the project's own SFT: `python -m cosmos_rl.commands.base_build build`.

Deterministic from `--seed` (given the same torch build and thread count). Stages, each an SFT run
directory under `--work` (a checkpoint every `--checkpoint-every` steps; running the command again
continues every unfinished stage from its newest checkpoint, and larger `--vae-steps`/`--steps`
extend finished ones, since `rl.max_steps` is not part of a run's identity):

1. shards: `--samples` task-balanced training prompts of the shapes world (`split_prompts(0)`,
   so the world's held-out prompts stay unseen) rendered into webdataset shards;
2. `init/`: the preset's architecture with random weights from the seed;
3. `runs/vae`: SFT with `rl.train = "vae"` (autoencoder), then the per-channel latent statistics
   of the trained encoder over the first 2048 samples -> `vae_model/`;
4. `runs/transformer`: SFT with `rl.train = "transformer"` (flow matching) on `vae_model/`;
5. the result as float16 safetensors + `manifest.json` in `--out` (default: the package's
   `cosmos_rl/models/presets/shapes/`), then its held-out scores (the shipped float16 weights,
   `shapes.held_out.held_out_scores`), written into the manifest.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from cosmos_rl.core.errors import UserError

SPLIT_SEED = 0  # each world's standard split (both bases): a base never sees a held-out prompt
LATENT_STAT_SAMPLES = 2048


# The image base's recipe defaults; the video base's build passes its own (commands.video_base_build).
IMAGE_RECIPE = dict(work="shapes_base_work", samples=20000, vae_steps=1500, vae_batch=32, steps=4000, batch=64, eval_seeds=8)


def build_parser(prog: str, description: str, weights_dir: Path, recipe: dict, unit: str = "samples",
                 what: str = "the base") -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:  # fmt: skip
    """(the parser, its `build` command) of a base build: `recipe` gives its defaults
    (IMAGE_RECIPE's keys), `unit` what a training sample is called in the help."""
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help=f"train {what} and write it (continues an interrupted build)")
    build.add_argument("--work", type=Path, default=Path(recipe["work"]), help="folder for shards and run directories")
    build.add_argument("--out", type=Path, default=weights_dir, help="where the weights go; default the package's preset folder")
    build.add_argument("--seed", type=int, default=0, help="weights, data order and noise; default 0")
    build.add_argument("--samples", type=int, default=recipe["samples"], help=f"rendered training {unit}; default {recipe['samples']}")
    build.add_argument("--vae-steps", type=int, default=recipe["vae_steps"], help=f"VAE optimizer steps; default {recipe['vae_steps']}")
    build.add_argument("--vae-batch", type=int, default=recipe["vae_batch"], help=f"VAE {unit} per step; default {recipe['vae_batch']}")
    build.add_argument("--vae-lr", type=float, default=1e-3, help="VAE learning rate; default 1e-3")
    fg = recipe.get("vae_foreground_weight", 1.0)
    build.add_argument("--vae-foreground-weight", type=float, default=fg,
                       help=f"the VAE stage's rl.foreground_weight (foreground pixels' weight in its loss); default {fg:g}")
    build.add_argument("--steps", type=int, default=recipe["steps"], help=f"transformer optimizer steps; default {recipe['steps']}")
    build.add_argument("--batch", type=int, default=recipe["batch"], help=f"transformer {unit} per step; default {recipe['batch']}")
    build.add_argument("--lr", type=float, default=5e-4, help="transformer learning rate; default 5e-4")
    build.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints; default 100")
    build.add_argument("--eval-seeds", type=int, default=recipe["eval_seeds"],
                       help=f"noise seeds per held-out prompt (319 prompts each); default {recipe['eval_seeds']}; 0 skips it")
    build.add_argument("--threads", type=int, default=1, help="torch threads; default 1")
    return parser, build


def _parser() -> argparse.ArgumentParser:
    from cosmos_rl.models.shapes_preset import WEIGHTS_DIR

    parser, build = build_parser("python -m cosmos_rl.commands.base_build", __doc__, WEIGHTS_DIR, IMAGE_RECIPE)
    build.add_argument("--guidance", type=float, nargs="+", default=[1.0, 3.0], help="guidance scales to score; default 1 3")
    return parser


def stage_config(args, name: str, train: str, model_path: Path, shards: list[str], label: str = "shapes_base",
                 model: dict | None = None, condition: dict | None = None):  # fmt: skip
    """The SFT run config of one stage, preflighted like a manifest. `model` adds `[model]` keys
    (e.g. num_frames), `condition` the `[model.condition]` of the transformer stage only (the VAE
    stage trains no clip through the transformer)."""
    from cosmos_rl.config import load, preflight
    from cosmos_rl.core.problems import ManifestError

    vae = train == "vae"
    raw = {
        # progress: a bar on a terminal, a line every 10 steps (or 30 s) in a log (a build takes hours)
        "job": {"name": name, "output_dir": str((args.work / "runs").resolve()), "seed": args.seed, "log_every": 10, "progress": True},
        "model": {"path": str(model_path.resolve()), "image_size": 32, **(model or {}), "lora": {"rank": 0},
                  **({"condition": condition} if condition and not vae else {})},
        "grid": {"device": "cpu"},
        "checkpoint": {"every": args.checkpoint_every, "keep": 1},
        "rl": {
            "algorithm": "sft", "train": train,
            "max_steps": args.vae_steps if vae else args.steps,
            "samples_per_step": args.vae_batch if vae else args.batch,
            "optimizer": {"lr": args.vae_lr if vae else args.lr, "warmup_steps": 0 if vae else min(100, args.steps // 10)},
            "data": {"shards": shards},
            **(_vae_keys(args) if vae else {}),
        },
    }
    config = load.structure(raw, f"{label} stage {name}")
    errors = [p for p in preflight.check(config, args.work) if p.severity == "error"]
    if errors:
        raise ManifestError(errors, f"{label} stage {name}")
    return config


def _vae_keys(args) -> dict:
    """The VAE stage's own `rl` keys: the foreground weight only when it is not plain MSE's 1, so an
    image build's stage config (and its run identity) is what it was before the option existed."""
    weight = getattr(args, "vae_foreground_weight", 1.0)
    return {} if weight == 1.0 else {"foreground_weight": weight}


def train_stage(config):
    """Run (or continue) one stage in this process; returns the trainer holding the trained model."""
    import torch

    from cosmos_rl.planning import plan, run_dir as run
    from cosmos_rl.trainers.sft import SFTTrainer

    run_dir = plan.run_dir(config)
    resume = run.has_committed_checkpoint(run_dir)
    if not resume:
        run.prepare_new(config, run_dir)
    trainer = SFTTrainer(config, run_dir, torch.device("cpu"), resume=resume)
    if trainer.step > config.rl.max_steps:
        raise UserError(
            f"{run_dir} has trained {trainer.step} steps, more than the {config.rl.max_steps} asked for; "
            "a build cannot go back: ask for at least as many steps, or use a new --work folder"
        )
    started, first = time.perf_counter(), trainer.step
    try:
        rows = trainer.run()
    finally:  # a stage stopped by a signal (it commits its step) still counts the time it trained
        seconds = time.perf_counter() - started
        _add_seconds(run_dir, seconds)
    last = rows[-1] if rows else {}
    print(f"{config.job.name}: steps {first} -> {trainer.step} in {seconds:.0f} s; "
          + ", ".join(f"{k} {v:.4g}" for k, v in last.items() if k != "step"), flush=True)
    return trainer


def _add_seconds(run_dir: Path, seconds: float) -> float:
    """Wall-clock of a stage summed over the calls that trained it (kept beside its metrics)."""
    path = Path(run_dir) / "wall_clock_s.json"
    total = json.loads(path.read_text())["seconds"] if path.is_file() else 0.0
    total += seconds
    path.write_text(json.dumps({"seconds": total}))
    return total


def latent_stats(vae, source, count: int, chunk: int = 256, encode=None) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the encoder's posterior means over the first `count` samples,
    `chunk` at a time; `encode(vae, batch)` gives the means (default `raw_latents`, for images)."""
    import torch

    from cosmos_rl.models.vae import raw_latents

    encode = encode or raw_latents
    chunks = []
    with torch.no_grad():
        for start in range(0, min(count, len(source)), chunk):
            batch = torch.stack([source[i].image for i in range(start, min(start + chunk, count, len(source)))])
            chunks.append(encode(vae, batch))
    latents = torch.cat(chunks).transpose(0, 1).reshape(vae.config.z_dim, -1)
    return latents.mean(dim=1).tolist(), latents.std(dim=1).tolist()


def build_base(args, *, preset: str, module: str, prefix: str, write_shards, initial_parts, stats, stage, held_out,
               media: dict | None = None) -> dict:  # fmt: skip
    """Stages 1-5 of a base build (module docstring), for the image base and the video base alike:
    `write_shards(folder)` renders the training set (skipped when `<prefix>-*.tar` are there),
    `initial_parts(seed)` is the starting model, `stats(vae, source)` the latent statistics,
    `stage(args, name, train, model_path, shards)` a stage's SFT config and `held_out(args)` the
    shipped weights' held-out scores (when `--eval-seeds` > 0); `media` goes into the manifest."""
    import torch

    from cosmos_rl.models.build import save_parts
    from cosmos_rl.models.shapes_preset import set_latent_stats, write_weights

    torch.set_num_threads(args.threads)
    work = args.work
    shard_dir = work / "shards"
    if not any(shard_dir.glob(f"{prefix}-*.tar")):
        write_shards(shard_dir)
    shards = [str(p.resolve()) for p in sorted(shard_dir.glob(f"{prefix}-*.tar"))]
    init = work / "init"
    if not (init / "transformer").is_dir():
        save_parts(initial_parts(args.seed), init)

    vae_trainer = train_stage(stage(args, "vae", "vae", init, shards))
    parts = vae_trainer.parts
    set_latent_stats(parts.vae, *stats(parts.vae.eval(), vae_trainer.source))
    save_parts(parts, work / "vae_model")

    flow_trainer = train_stage(stage(args, "transformer", "transformer", work / "vae_model", shards))
    parts = flow_trainer.parts
    parts.transformer.eval()
    runs = work / "runs"
    info = {
        "preset": preset,
        "command": shlex.join(["python", "-m", module, *sys.argv[1:]]),
        "recipe": {k: v for k, v in vars(args).items() if k not in ("work", "out", "command")},
        **({"media": media} if media is not None else {}),
        "split_seed": SPLIT_SEED,
        "wall_clock_s": {s: round(json.loads((runs / s / "wall_clock_s.json").read_text())["seconds"]) for s in ("vae", "transformer")},
        "torch": torch.__version__,
    }
    manifest = write_weights(parts, args.out, info)
    if args.eval_seeds > 0:
        manifest["held_out"] = held_out(args)
        (Path(args.out) / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


def _held_out(args) -> dict:
    """The shipped float16 weights' held-out scores at each `--guidance`."""
    from cosmos_rl.models.shapes_held_out import held_out_scores
    from cosmos_rl.models.shapes_preset import load_shapes_base

    shipped = load_shapes_base(args.out)
    return {f"guidance_{g:g}": held_out_scores(shipped, seeds=range(args.eval_seeds), guidance=g) for g in args.guidance}


def build(args) -> dict:
    from cosmos_rl.shapes import balanced, split_prompts, write_shards
    from cosmos_rl.models.shapes_preset import shapes_architecture

    def shards(folder: Path) -> None:
        write_shards(folder, balanced(split_prompts(SPLIT_SEED).train, args.samples, args.seed), args.seed)

    return build_base(
        args, preset="shapes", module="cosmos_rl.commands.base_build", prefix="shapes", write_shards=shards,
        initial_parts=shapes_architecture, stats=lambda vae, source: latent_stats(vae, source, LATENT_STAT_SAMPLES),
        stage=stage_config, held_out=_held_out,
    )


def run_main(parser: argparse.ArgumentParser, build_fn, argv: Optional[Sequence[str]] = None, preset: str = "shapes",
             next_step: str | None = None) -> int:
    """Parse, check the counts, build; a user error is one line and exit 2. The result's JSON goes
    to stdout, then the closing summary to stderr (so stdout stays one JSON object); `next_step`
    replaces the summary's `next:` line (default: evaluate the preset)."""
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        for name in ("samples", "vae_steps", "vae_batch", "steps", "batch", "checkpoint_every", "threads"):
            if getattr(args, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        manifest = build_fn(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: manifest[k] for k in ("files", "wall_clock_s", "held_out") if k in manifest}, indent=2), flush=True)
    for line in closing_lines(preset, args.out, manifest, time.monotonic() - started, next_step):
        print(line, file=sys.stderr, flush=True)
    return 0


def closing_lines(preset: str, out: Path, manifest: dict, seconds: float, next_step: str | None = None) -> list[str]:
    """A build's closing summary: its time (and each stage's, over every call that trained it), where
    the weights are, the held-out scores, what to run next."""
    from cosmos_rl.commands.run_summary import clock

    stages = ", ".join(f"{name} {clock(s)}" for name, s in manifest.get("wall_clock_s", {}).items())
    lines = [f"done: built {preset} in {clock(seconds)} (stages: {stages}); weights and manifest.json in {out}"]
    held_out = manifest.get("held_out") or {}
    if held_out:
        lines.append("  held-out: " + "; ".join(
            f"{name} strict {scores['strict']:.4f} partial {scores['partial']:.4f}" for name, scores in held_out.items()))
    lines.append(next_step or f"  next: cosmos-rl eval preset:{preset}    # the shipped weights, when --out is the package's preset folder (the default)")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_main(_parser(), build, argv)


if __name__ == "__main__":
    sys.exit(main())
