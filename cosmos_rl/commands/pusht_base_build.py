"""Build the Push-T world-model base with the project's own SFT: `python -m cosmos_rl.commands.pusht_base_build build`.

Stage 1 of the `pusht` base: the stages below run and resume as the shapes
bases' do (`commands.base_build`: each SFT stage is a run directory under `--work` with a
checkpoint every `--checkpoint-every` steps; running the command again continues every unfinished
stage, larger `--vae-steps` / `--steps` extend finished ones). The result is a model folder
(`<work>/model`, usable as `model.path`) plus float16 weights and `manifest.json` in `--out`: the
files of the `pusht` preset (`models.pusht_preset`), which loads them from
`cosmos_rl/models/presets/pusht/` once they are copied there.

1. `dataset/`: `--samples` Push-T episodes of `--frames` frames at `--size` x `--size` (planner and
   random targets, half each, `pusht.episodes.make_episodes` with `--seed`) as a LeRobot dataset;
2. `init/`: the preset's networks (`models.architectures.PUSHT_TRANSFORMER`: the video base's
   transformer with action heads, `action_gen`, `NUM_DOMAINS` = 21 embodiment domains as
   Cosmos3-Nano has, so `pusht` is domain 4, `ACTION_DIM` columns; `PUSHT_VAE`: the video VAE in
   the fine layout, no temporal stage, one spatial stage), every shared weight from the shipped
   `shapes_video` preset, the action heads random from the seed;
3. `runs/vae`: SFT with `rl.train = "vae"` on every 9-frame window of the dataset
   (foreground-weighted, `--vae-foreground-weight`; the verifier's pixel classes weighted,
   `--vae-classes` / `--vae-miss` as `[rl.pixel_weights]`; the loss on the decoder's unclamped
   output, `rl.unclamped_loss`) -> `vae_early/`; then `runs/vae_late`: `--vae-late-steps` more from
   those weights (a fresh optimizer) with the misses weighted `--vae-late-miss`; then the encoder's
   per-channel latent statistics over the first `LATENT_STAT_CLIPS` windows -> `vae_model/`;
4. the gate: ground truth through the trained VAE, scored by the Push-T verifier
   (`pusht.verifier.verify_dynamics`) on held-out planner and random windows (episodes from
   `HELD_OUT_SEED`, never trained on), must score strict >= `VAE_GATE` (a VAE
   that rounds the scene caps every later number); below it the build stops with the figures;
5. `runs/transformer`: SFT in `forward_dynamics` (frame 0 and the 8 action rows given, the 8
   frames after it generated) on `vae_model/` -> `model/` and the float16 files in `--out`.

Each stage prints its wall-clock; `manifest.json` records them and the gate's figures.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from cosmos_rl.commands.base_build import build_parser, latent_stats, run_main, train_stage
from cosmos_rl.core.errors import UserError
from cosmos_rl.models.architectures import PUSHT_TRANSFORMER

FRAMES = 9  # a chunk of 8 actions + 1 (4k + 1 for the Wan VAE): 9 latent frames through the fine layout's VAE
SIDE = 32  # the smallest side at which the verifier passes the simulator's own frames (docs/studies/2026-12-07-pusht-vae.md)
EPISODE_FRAMES = 40  # frames per training episode: 32 windows of 9 each
# The transformer's action columns (Push-T's width: padding columns would be in no loss anyway) and
# Cosmos3-Nano's embodiment domains (`pusht` is 4): the preset's architecture's, recorded in manifest.json.
ACTION_DIM = PUSHT_TRANSFORMER["action_dim"]
NUM_DOMAINS = PUSHT_TRANSFORMER["num_embodiment_domains"]
HELD_OUT_SEED = 1_000_003  # the held-out episodes' seed (the gate's); a build's --seed may not be it
HELD_OUT_EPISODES = 16  # half planner, half random
HELD_OUT_STRIDE = 4  # window starts in a held-out episode
VAE_GATE = 0.9  # ground truth through the VAE: held-out strict at least this before the transformer trains
LATENT_STAT_CLIPS = 512
PUSHT = {"embodiment": "pusht", "offset": [256.0, 256.0], "scale": [256.0, 256.0]}  # pusht.episodes' normalisation

# VAE learning rate and foreground weight: see the study (the shapes video VAE needed weight 10 to
# draw small shapes on a plain background; Push-T's agent is a 2-px disc at 32 x 32). VAE steps: this
# one stage with the agent and the misses weighted from step 0 scored strict 0.51 / 0.64 / 0.94 on the
# gate's 80 windows at 1,000 / 2,000 / 4,000 steps and 0.975 at 5,502 (seed 0); the study's chain of
# runs that grew those weights one at a time needed 9,800 (docs/studies/2026-12-07-pusht-vae.md).
PUSHT_RECIPE = dict(work="pusht_base_work", samples=64, vae_steps=5500, vae_batch=8, vae_foreground_weight=10.0,
                    steps=2000, batch=16, eval_seeds=0)  # fmt: skip
# The VAE stage's [rl.pixel_weights] (suite pusht): the agent's 2-4 pixels at 32 x 32 weigh 30, and
# every pixel the verifier classes wrongly in the round trip 100. The study's round trip reached
# the first whole windows only with the agent weighted and climbed fastest with the misses weighted
# (docs/studies/2026-12-07-pusht-vae.md).
VAE_CLASSES = "agent=30"
VAE_MISS = 100.0
VAE_LATE_STEPS = 0
VAE_LATE_MISS = 1000.0
# The transformer's latent patch: 4 x 4 latent cells a token (144 vision tokens a 9-frame clip at
# 32 x 32, where the video base's patch 2 makes 576): a forward-dynamics SFT step 3.0x faster
# side by side (0.75 s against 2.0-2.5 s at 16 windows, one thread), which is what lets the
# transformer stage and the online runs on it fit a CPU session. proj_in / proj_out start random.
PATCH = PUSHT_TRANSFORMER["latent_patch_size"]


def _parser() -> argparse.ArgumentParser:
    parser, build = build_parser("python -m cosmos_rl.commands.pusht_base_build", __doc__, Path("pusht_base_out"), PUSHT_RECIPE,
                                 unit="windows", what="the Push-T base")  # fmt: skip
    # The shared options say "windows" (what a step trains on); two read differently here.
    for action in build._actions:
        if action.dest == "samples":
            action.help = f"training episodes (half planner, half random); default {PUSHT_RECIPE['samples']}"
        elif action.dest == "out":
            action.help = "where the float16 weights and manifest.json go (the pusht preset's files); default pusht_base_out"
        elif action.dest == "work":
            action.help = "folder for the dataset, the run directories and the model folders; default pusht_base_work"
        elif action.dest == "eval_seeds":
            action.help = "unused by this build yet (no held-out sampling of the transformer); default 0"
    build.add_argument("--size", type=int, default=SIDE, help=f"frame side in pixels; default {SIDE}")
    build.add_argument("--episode-frames", type=int, default=EPISODE_FRAMES, help=f"frames per training episode; default {EPISODE_FRAMES}")
    build.add_argument("--vae-classes", default=VAE_CLASSES,
                       help=f"the VAE stage's rl.pixel_weights.classes as NAME=W,... (Push-T's classes: agent, block; empty: none); default {VAE_CLASSES}")
    build.add_argument("--vae-miss", type=float, default=VAE_MISS,
                       help=f"the VAE stage's rl.pixel_weights.miss (pixels the verifier classes wrongly; 1 = off); default {VAE_MISS:g}")
    build.add_argument("--vae-late-steps", type=int, default=VAE_LATE_STEPS,
                       help=f"steps of the late VAE stage (from the VAE stage's weights, a fresh optimizer; 0 = none); default {VAE_LATE_STEPS}")
    build.add_argument("--vae-late-miss", type=float, default=VAE_LATE_MISS,
                       help=f"the late VAE stage's rl.pixel_weights.miss; default {VAE_LATE_MISS:g}")
    build.add_argument("--patch", type=int, default=PATCH, choices=(2, 4),
                       help=f"the transformer's latent patch side (2: the video base's, every weight from it; 4: 4x fewer tokens, "
                            f"new patch projections); default {PATCH}")
    build.add_argument("--vae-weights", default="",
                       help="a trained VAE state dict of the fine layout (`bench/pusht_vae.py --save`, or a .safetensors such as "
                            "a build's vae_model/vae/diffusion_pytorch_model.safetensors): skips the VAE stages, "
                            "the file goes to the gate and on; recorded with its sha256 in manifest.json; default: train the VAE stage")
    build.add_argument("--held-out-episodes", type=int, default=HELD_OUT_EPISODES,
                       help=f"held-out episodes the VAE gate scores (half planner, half random); default {HELD_OUT_EPISODES}")
    return parser


def stage_config(args, name: str, train: str, model_path: Path, dataset: Path, late: bool = False):
    """One stage's SFT config, preflighted like a manifest: forward dynamics on the dataset's
    windows (the VAE stages read the same windows; their loss ignores the actions). `late`: the
    late VAE stage (`--vae-late-steps`, misses weighted `--vae-late-miss`)."""
    from cosmos_rl.config import load, preflight
    from cosmos_rl.core.problems import ManifestError
    from cosmos_rl.pusht.sim import FPS

    vae = train == "vae"
    raw = {
        "job": {"name": name, "output_dir": str((args.work / "runs").resolve()), "seed": args.seed, "log_every": 10, "progress": True},
        "model": {"path": str(model_path.resolve()), "lora": {"rank": 0}, "num_frames": FRAMES, "fps": FPS,
                  "height": args.size, "width": args.size,
                  "condition": {"kind": "forward_dynamics", "source": "data"}, "action": PUSHT},
        "grid": {"device": "cpu"},
        "checkpoint": {"every": args.checkpoint_every, "keep": 1},
        "rl": {
            "algorithm": "sft", "train": train,
            "max_steps": (args.vae_late_steps if late else args.vae_steps) if vae else args.steps,
            "samples_per_step": args.vae_batch if vae else args.batch,
            "optimizer": {"lr": args.vae_lr if vae else args.lr, "warmup_steps": 0 if vae else min(100, args.steps // 10)},
            "data": {"lerobot": str(dataset.resolve())},
            **({"foreground_weight": args.vae_foreground_weight} if vae and args.vae_foreground_weight != 1.0 else {}),
            # The shapes video VAE (made on black frames) overshoots [-1, 1] on Push-T's white scene:
            # through the decoder's clamp two thirds of the foreground get no gradient and the VAE
            # never leaves a blank frame (docs/studies/2026-12-07-pusht-vae.md).
            **({"unclamped_loss": True} if vae else {}),
            **({"pixel_weights": pixel_weights(args, late)} if vae and pixel_weights(args, late) else {}),
        },
    }
    config = load.structure(raw, f"pusht_base stage {name}")
    errors = [p for p in preflight.check(config, args.work) if p.severity == "error"]
    if errors:
        raise ManifestError(errors, f"pusht_base stage {name}")
    return config


def pixel_weights(args, late: bool = False) -> dict:
    """A VAE stage's `[rl.pixel_weights]` table from --vae-classes / --vae-miss (the late stage's
    miss: --vae-late-miss); {} when both are off."""
    try:
        classes = {name.strip(): float(w) for name, w in (item.split("=") for item in args.vae_classes.split(",") if item.strip())}
    except ValueError:
        raise UserError(f"--vae-classes: expected NAME=WEIGHT,... (e.g. agent=30), got {args.vae_classes!r}") from None
    miss = args.vae_late_miss if late else args.vae_miss
    if not classes and miss == 1.0:
        return {}
    return {"suite": "pusht", "classes": classes, "miss": miss}


def initial_parts(seed: int, patch: int = PATCH):
    """The `pusht` preset's networks (`models.pusht_preset.pusht_architecture`: the video base's
    transformer with Push-T action heads, here at `patch` x `patch` latent patches) random from
    `seed`, then every weight the shipped `shapes_video` preset has of the same shape (all but the
    action heads and, at a patch other than the video base's 2, the patch projections `proj_in` /
    `proj_out`, which keep their random start); and the video VAE in the fine layout (`PUSHT_VAE`),
    started from the video VAE's weights of the same names (all of its own)."""
    from cosmos_rl.models.architectures import SHAPES_VIDEO_TRANSFORMER
    from cosmos_rl.models.build import build_preset
    from cosmos_rl.models.pusht_preset import pusht_architecture

    parts = pusht_architecture(seed, patch)
    transformer, vae = parts.transformer, parts.vae
    video = build_preset("shapes_video", seed)
    own = transformer.state_dict()
    missing, unexpected = transformer.load_state_dict(
        {k: v for k, v in video.transformer.state_dict().items() if k not in own or own[k].shape == v.shape}, strict=False)
    # Only the action heads (and another patch's projections) are new; anything else missing would be a silently random base.
    new = ("action_",) + (() if patch == SHAPES_VIDEO_TRANSFORMER["latent_patch_size"] else ("proj_in.", "proj_out."))
    assert not unexpected and missing and all(k.startswith(new) for k in missing), (missing, unexpected)
    start = video.vae.state_dict()
    # The fine layout's modules are a subset of the video VAE's, by name and shape: none stays random.
    assert all(k in start and start[k].shape == v.shape for k, v in vae.state_dict().items())
    vae.load_state_dict({k: start[k] for k in vae.state_dict()}, strict=True)
    vae.register_to_config(latents_mean=list(video.vae.config.latents_mean), latents_std=list(video.vae.config.latents_std))
    return parts


def write_episodes(folder: Path, count: int, seed: int, frames: int, size: int) -> Path:
    """`count` Push-T episodes (half planner, half random) as a LeRobot dataset at `folder`."""
    from cosmos_rl.data.lerobot_write import write_dataset
    from cosmos_rl.pusht.episodes import make_episodes
    from cosmos_rl.pusht.sim import FPS

    episodes = make_episodes(count, seed, frames=frames, size=size)
    return write_dataset(folder, episodes, fps=FPS, robot_type="pusht", robot_state=lambda e: e.states[:, :2])


def held_out_windows(count: int, size: int, frames: int = FRAMES, stride: int = HELD_OUT_STRIDE, episode_frames: int = 25):
    """(clips uint8 [N, frames, H, W, 3], states [N, frames, 10], kinds ['planner' | 'random']) of the
    held-out episodes (`HELD_OUT_SEED`): windows starting every `stride` frames."""
    import numpy as np

    from cosmos_rl.pusht.episodes import make_episodes

    episodes = make_episodes(count, HELD_OUT_SEED, frames=episode_frames, size=size)
    planned = round(count * 0.5)  # make_episodes' split: the first half from the planner
    clips, states, kinds = [], [], []
    for episode in episodes:
        for start in range(0, episode_frames - frames + 1, stride):
            clips.append(episode.frames[start:start + frames])
            states.append(episode.states[start:start + frames])
            kinds.append("planner" if episode.index < planned else "random")
    return np.stack(clips), np.stack(states), kinds


def vae_round_trip(vae, clips, batch: int = 8):
    """uint8 clips [N, F, H, W, 3] through `vae` (encode's posterior mean, decode), as uint8 again."""
    import numpy as np
    import torch

    from cosmos_rl.models.vae import reconstruction

    out = []
    with torch.no_grad():
        for start in range(0, len(clips), batch):
            x = torch.from_numpy(np.ascontiguousarray(clips[start:start + batch])).permute(0, 4, 1, 2, 3).float() / 255.0
            decoded, _ = reconstruction(vae, x)
            out.append(((decoded.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 4, 1).numpy())
    return np.concatenate(out)


def score_clips(clips, states, kinds) -> dict:
    """verify_dynamics (frame 0 given) of each clip against its states: strict, partial, the agent's
    and the block's pass rates over judged frames, and strict per kind."""
    import numpy as np

    from cosmos_rl.pusht.verifier import verify_dynamics

    verdicts = [verify_dynamics(clip, state) for clip, state in zip(clips, states)]
    frames = [f for v in verdicts for f in v.frames]
    result = {
        "windows": len(verdicts),
        "strict": round(float(np.mean([v.strict for v in verdicts])), 4),
        "partial": round(float(np.mean([v.partial for v in verdicts])), 4),
        "agent": round(float(np.mean([f.agent_ok for f in frames])), 4),
        "block": round(float(np.mean([f.block_ok for f in frames])), 4),
    }
    for kind in sorted(set(kinds)):
        result[f"strict_{kind}"] = round(float(np.mean([v.strict for v, k in zip(verdicts, kinds) if k == kind])), 4)
    return result


def vae_gate(vae, args) -> dict:
    """Ground truth through `vae` on the held-out windows, scored; raises UserError below VAE_GATE."""
    clips, states, kinds = held_out_windows(args.held_out_episodes, args.size)
    scores = score_clips(vae_round_trip(vae, clips), states, kinds)
    print(f"vae gate: ground truth through the VAE, {scores['windows']} held-out windows: strict {scores['strict']:.4f} "
          f"partial {scores['partial']:.4f} (agent {scores['agent']:.4f}, block {scores['block']:.4f})", flush=True)
    if scores["strict"] < VAE_GATE:
        late = args.vae_late_steps > 0 and not args.vae_weights
        stage = args.work / "runs" / ("vae_late" if late else "vae")
        more = (f"raise --vae-late-steps (continues {stage}), or --vae-steps / --vae-foreground-weight in a new --work" if late
                else f"raise --vae-steps (continues {stage}) or --vae-foreground-weight (a new --work)")
        raise UserError(
            f"the VAE gate failed: ground truth through the trained VAE scores strict {scores['strict']:.4f} < {VAE_GATE} on "
            f"{scores['windows']} held-out windows (partial {scores['partial']:.4f}, agent {scores['agent']:.4f}, "
            f"block {scores['block']:.4f}); the transformer would be capped by it: {more}"
        )
    return scores


def build(args) -> dict:
    import torch

    from cosmos_rl.models.build import save_parts
    from cosmos_rl.models.shapes_preset import set_latent_stats, write_weights

    if args.seed == HELD_OUT_SEED:
        raise UserError(f"--seed {args.seed} is the held-out episodes' seed; pick another")
    if args.size < 32 or args.size % 8 or args.episode_frames < FRAMES:
        raise UserError(f"--size must be a multiple of 8 and >= 32, --episode-frames >= {FRAMES}; got {args.size}, {args.episode_frames}")
    pixel_weights(args)  # a malformed --vae-classes is refused before the dataset is written, not after
    if args.vae_late_steps < 0:
        raise UserError(f"--vae-late-steps must be >= 0 (0: no late VAE stage), got {args.vae_late_steps}")
    torch.set_num_threads(args.threads)
    work = args.work
    if args.vae_weights and (work / "runs" / "vae").exists():
        raise UserError(f"--vae-weights: {work / 'runs' / 'vae'} holds a VAE stage this build trained; pass a new --work, or drop --vae-weights")
    clock = {}
    dataset = work / "dataset"
    if not (dataset / "meta" / "info.json").is_file():
        started = time.perf_counter()
        write_episodes(dataset, args.samples, args.seed, args.episode_frames, args.size)
        clock["dataset"] = time.perf_counter() - started
    init = work / "init"
    if not (init / "transformer").is_dir():
        save_parts(initial_parts(args.seed, args.patch), init)

    given = {}
    if args.vae_weights:
        parts, source, given = given_vae(args.vae_weights, init, dataset, args.size)
    else:
        vae_trainer = train_stage(stage_config(args, "vae", "vae", init, dataset))
        if args.vae_late_steps > 0:
            vae_trainer = train_stage(stage_config(args, "vae_late", "vae", early_vae(vae_trainer, work), dataset, late=True))
        parts, source = vae_trainer.parts, vae_trainer.source
    vae = parts.vae.eval()
    set_latent_stats(vae, *latent_stats(vae, source, LATENT_STAT_CLIPS, chunk=32, encode=_clip_means))
    started = time.perf_counter()
    gate = vae_gate(vae, args)
    clock["vae_gate"] = time.perf_counter() - started
    # The VAE stages never train the transformer: the transformer stage starts from the initial one at --patch.
    check_patch(work, args.patch)
    parts.transformer = initial_parts(args.seed, args.patch).transformer
    save_parts(parts, work / "vae_model")

    flow_trainer = train_stage(stage_config(args, "transformer", "transformer", work / "vae_model", dataset))
    parts = flow_trainer.parts
    parts.transformer.eval()
    save_parts(parts, work / "model")
    runs = work / "runs"
    stages = ("transformer",) if given else ("vae", *(("vae_late",) if args.vae_late_steps > 0 else ()), "transformer")
    clock.update({s: json.loads((runs / s / "wall_clock_s.json").read_text())["seconds"] for s in stages})
    info = {
        "preset": "pusht",
        "command": shlex.join(["python", "-m", "cosmos_rl.commands.pusht_base_build", *sys.argv[1:]]),
        "recipe": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("work", "out", "command")},
        "media": {"frames": FRAMES, "size": args.size, "fps": 10.0},
        "action": {"embodiment": "pusht", "action_dim": ACTION_DIM, "num_embodiment_domains": NUM_DOMAINS, **PUSHT},
        "vae_gate": {**gate, "threshold": VAE_GATE, "held_out_seed": HELD_OUT_SEED},
        **({"vae_weights": given} if given else {}),
        "wall_clock_s": {k: round(v) for k, v in clock.items()},
        "torch": torch.__version__,
    }
    manifest = write_weights(parts, args.out, info)
    manifest["held_out"] = {"vae_gate": gate}  # what run_main prints beside the files
    return manifest


def check_patch(work: Path, patch: int) -> None:
    """A transformer stage that has started keeps its patch (its checkpoint holds the projections' shapes)."""
    config = work / "vae_model" / "transformer" / "config.json"
    if (work / "runs" / "transformer").exists() and config.is_file():
        started = json.loads(config.read_text())["latent_patch_size"]
        if started != patch:
            raise UserError(f"--patch {patch}: {work / 'runs' / 'transformer'} started at patch {started}; ask for --patch {started}, or use a new --work")


def early_vae(trainer, work: Path) -> Path:
    """`<work>/vae_early`: the VAE stage's trained model, the late stage's start (written once, with
    the step it holds; a VAE stage extended after the late stage started from it is refused)."""
    from cosmos_rl.models.build import save_parts

    folder, record = work / "vae_early", work / "vae_early" / "steps.json"
    if record.is_file():
        steps = json.loads(record.read_text())["steps"]
        if steps != trainer.step:
            raise UserError(f"--vae-steps: {work / 'runs' / 'vae_late'} started from the VAE stage at step {steps}, and that stage is now at "
                            f"{trainer.step}; ask for --vae-steps {steps}, or use a new --work")
        return folder
    save_parts(trainer.parts, folder)
    record.write_text(json.dumps({"steps": trainer.step}))
    return folder


def given_vae(path: str, init: Path, dataset: Path, size: int):
    """(the init parts with the VAE of the state dict at `path`, the dataset's windows, {"file",
    "sha256"}): `--vae-weights` in place of the VAE stages. A `.safetensors` file (e.g. a build's
    `vae_model/vae/diffusion_pytorch_model.safetensors`) or a torch file read with the weights-only
    loader (no code runs); every key of the fine layout's VAE must be there, and nothing else."""
    import hashlib
    import pickle

    import torch

    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.data.episode_windows import lerobot_windows
    from cosmos_rl.models.build import load_parts
    from cosmos_rl.pusht.sim import FPS

    file = Path(path)
    try:
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(file)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise UserError(f"--vae-weights {file}: cannot read it as a state dict ({exc}); pass a `bench/pusht_vae.py --layout fine --save` file "
                        "or a build's <work>/vae_model/vae/diffusion_pytorch_model.safetensors") from None
    parts = load_parts(init, heads=True)
    own = parts.vae.state_dict()
    missing, extra = sorted(set(own) - set(state or {})), sorted(set(state or {}) - set(own))
    shapes = [k for k in own if k in (state or {}) and tuple(state[k].shape) != tuple(own[k].shape)]
    if not isinstance(state, dict) or missing or extra or shapes:
        raise UserError(f"--vae-weights {file}: not the fine layout's VAE ({len(missing)} keys missing, {len(extra)} unexpected, "
                        f"{len(shapes)} of another shape; e.g. {(missing + extra + shapes + [''])[0]!r}); "
                        "pass a `bench/pusht_vae.py --layout fine --save` file")  # fmt: skip
    parts.vae.load_state_dict(state, strict=True)
    media = MediaSpec(frames=FRAMES, height=size, width=size, fps=FPS)
    return parts, lerobot_windows(str(dataset), "", media, ACTION_DIM), {"file": str(file.resolve()), "sha256": digest}


def _clip_means(vae, clips):
    """The encoder's posterior means of [B, 3, F, H, W] clips in [0, 1]."""
    return vae.encode(clips * 2 - 1).latent_dist.mode()


def main(argv: Optional[Sequence[str]] = None) -> int:
    # The preset loads the files from the package once they are copied there (`model.preset = "pusht"`).
    return run_main(_parser(), build, argv, preset="pusht",
                    next_step="  next: copy --out's files into cosmos_rl/models/presets/pusht/ for model.preset = \"pusht\", "
                              "or train on <work>/model as model.path (docs/world.md)")


if __name__ == "__main__":
    sys.exit(main())
