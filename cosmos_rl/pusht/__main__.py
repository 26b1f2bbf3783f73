"""``python -m cosmos_rl.pusht dataset OUT_DIR --episodes N ...``: write Push-T episodes, from the
planner and from smooth random targets on gym-pusht's simulator, as a LeRobot-format dataset
(what `rl.data.lerobot` trains the world model on; docs/world.md).

The frames are rendered at `--size` (the run's model.height and model.width: the data is never
resized), the actions are the agent's target positions in the 512 x 512 world (Cosmos3's `pusht`
embodiment, 2 wide), the simulator's full state rides along as `observation.environment_state`
and the agent's position as `observation.state`, as LeRobot's own Push-T dataset has it. The same
arguments write the same dataset, byte for byte in its tables.

``python -m cosmos_rl.pusht windows OUT.txt --episodes N --frames F ...``: write the keys of Push-T
training windows (`pusht/windows.py`), one a line: the prompt file of an
online world-model run (`[model.condition] source = "pusht"`); nothing is simulated until a run
draws a row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from cosmos_rl.core.errors import UserError
from cosmos_rl.data.lerobot_write import write_dataset
from cosmos_rl.pusht.episodes import make_episodes
from cosmos_rl.pusht.sim import FPS, NATIVE_SIZE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cosmos_rl.pusht", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    dataset = commands.add_parser("dataset", help="write planner and random-action episodes as a LeRobot dataset")
    dataset.add_argument("out_dir", type=Path, help="a new (or empty) folder")
    dataset.add_argument("--episodes", type=int, required=True, help="number of episodes")
    dataset.add_argument("--frames", type=int, default=50, help="frames per episode; default 50")
    dataset.add_argument("--size", type=int, default=NATIVE_SIZE, help=f"frame side in pixels; default {NATIVE_SIZE} (gym-pusht's)")
    dataset.add_argument("--seed", type=int, default=0, help="episode seed (start states, planner and random targets); default 0")
    dataset.add_argument("--random-share", type=float, default=0.5, help="share of random-action episodes; default 0.5")
    windows = commands.add_parser("windows", help="write the keys of training windows as a prompt file")
    windows.add_argument("out", type=Path, help="the prompt file to write (.txt)")
    windows.add_argument("--episodes", type=int, required=True, help="episodes per maker (planner, random)")
    windows.add_argument("--frames", type=int, required=True, help="frames per window: the run's model.num_frames (chunk + 1)")
    windows.add_argument("--length", type=int, default=30, help="frames per episode; default 30")
    windows.add_argument("--stride", type=int, default=1, help="frames between window starts; default 1")
    windows.add_argument("--seed", type=int, default=0, help="episode seed (never 50000, the held-out split); default 0")
    return parser


def _windows(args) -> None:
    from cosmos_rl.pusht.windows import training_keys

    keys = training_keys(args.episodes, args.seed, args.frames - 1, length=args.length, stride=args.stride)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(f"{key}\n" for key in keys))
    print(f"wrote {len(keys)} window keys ({args.episodes} episodes per maker, {args.frames} frames each): {args.out}")


def _dataset(args) -> None:
    if args.episodes < 1 or args.frames < 2 or args.size < 8:
        raise UserError(f"--episodes >= 1, --frames >= 2 and --size >= 8, got {args.episodes}, {args.frames}, {args.size}")
    episodes = make_episodes(args.episodes, args.seed, frames=args.frames, size=args.size, random_share=args.random_share)
    # observation.state: the agent's position (the robot's own state), as LeRobot's Push-T dataset has it.
    root = write_dataset(args.out_dir, episodes, fps=FPS, robot_type="pusht", robot_state=lambda e: e.states[:, :2])
    print(f"wrote {len(episodes)} episodes of {args.frames} frames at {args.size}x{args.size}, {FPS:g} fps: {root}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        (_windows if args.command == "windows" else _dataset)(args)
    except (UserError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
