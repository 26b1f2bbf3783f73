"""Every number a refactor must keep: `python3 bench/house_parity.py capture OUT` runs the shipped
manifests at the budgets below and keeps each run's `metrics.jsonl` and `cosmos-rl eval --json`;
`python3 bench/house_parity.py compare OUT FIXTURES` diffs two such folders key by key and prints
JSON (`time/*` and `train/*_per_s` are wall-clock and left out, as are the paths in eval.json and
keys added since the capture when only the newer folder has them: eval's intervals). Exit 1 when
anything differs.

The committed "before" fixtures (tests/fixtures/house_before/) come from `capture` at the commits
their README names. The runs (RUNS below; about 20 minutes on 2 cores for the first five, about 12 more
for the other five):
  dpo_t2i_smoke, nft_t2i_smoke           as shipped
  nft_shapes_cpu                         rl.max_steps=20
  dpo_shapes_cpu                         rl.max_steps=50, on pairs mined by its header's command
  sft_shapes_cpu                         rl.max_steps=100, on shards written by its header's command
  grpo_shapes_cpu                        rl.max_steps=6
  nft_video_shapes_cpu                   rl.max_steps=5
  nft_i2v_shapes_cpu                     rl.max_steps=5; evaluated with --i2v
  dpo_video_shapes_cpu                   rl.max_steps=20, on clip pairs mined by its header's command from
                                         the first 24 lines of manifests/shapes_video_train.txt
  sft_video_shapes_cpu                   rl.max_steps=20, on the 200 clips (one shard) of its header's
                                         command at --samples 200
The first five are evaluated with `cosmos-rl eval RUN --json` at its defaults (and keep their
manifests' [rl.eval], which evaluates during training only where rl.eval.every divides their steps).
The last five evaluate during training once, at step 5 (GRPO, NFT) or 20 (DPO, SFT), on 2 held-out
prompts per task x 1 seed (rl.eval.every, rl.eval.per_task, rl.eval.seeds overridden), and are
evaluated after it with `--per-task 2 --seeds 1` (RUNS' eval arguments).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}

MINE = ["pairs", "mine", "preset:shapes", "--reward", "shapes_strict", "--prompts", "manifests/shapes_train.txt",
        "--samples", "8", "--sample-steps", "10", "--guidance", "1", "--out", "shapes/pairs", "--device", "cpu"]  # fmt: skip
SHARDS = ["shards", "shapes/sft", "--samples", "20000", "--seed", "0"]
# dpo_video_shapes_cpu's header command, on the first 24 training prompts (written by its first setup step)
VIDEO_PROMPTS = "shapes/video_train_first24.txt"
VIDEO_MINE = ["pairs", "mine", "preset:shapes_video", "--frames", "9", "--reward", "shapes_video_partial", "--prompts", VIDEO_PROMPTS,
              "--samples", "8", "--sample-steps", "10", "--guidance", "1", "--per-shard", "2000", "--out", "shapes/video_pairs_small",
              "--device", "cpu"]  # fmt: skip
# sft_video_shapes_cpu's header command at 200 clips: one shard
VIDEO_SHARDS = ["video-shards", "shapes/video_small", "--samples", "200", "--seed", "0"]


class Run(NamedTuple):
    manifest: str
    overrides: list[str]
    # the setup its header names: `python -m ARGS...` command lines, or a function of the scratch folder
    setup: list[list[str] | Callable[[Path], None]]
    eval_args: list[str]  # after `cosmos-rl eval RUN --json --device cpu --out DIR`


def _head(src: str, dst: str, lines: int) -> Callable[[Path], None]:
    def write(work: Path) -> None:
        (work / dst).parent.mkdir(parents=True, exist_ok=True)
        (work / dst).write_text("".join((work / src).read_text().splitlines(keepends=True)[:lines]))

    return write


# The five added later: a small `cosmos-rl eval` (2 held-out prompts per task x 1 seed), and their [rl.eval]
# overridden to evaluate once during training (every: a multiple of job.log_every) on as few items.
SMALL_EVAL = ["--per-task", "2", "--seeds", "1"]
RUNS: dict[str, Run] = {
    "dpo_t2i_smoke": Run("dpo_t2i_smoke.toml", [], [], []),
    "nft_t2i_smoke": Run("nft_t2i_smoke.toml", [], [], []),
    "nft_shapes_cpu": Run("nft_shapes_cpu.toml", ["rl.max_steps=20"], [], []),
    "dpo_shapes_cpu": Run("dpo_shapes_cpu.toml", ["rl.max_steps=50"], [["cosmos_rl.cli", *MINE]], []),
    "sft_shapes_cpu": Run("sft_shapes_cpu.toml", ["rl.max_steps=100"], [["cosmos_rl.shapes", *SHARDS]], []),
    "grpo_shapes_cpu": Run("grpo_shapes_cpu.toml", ["rl.max_steps=6", "rl.eval.every=5", "rl.eval.per_task=2", "rl.eval.seeds=1"],
                           [], SMALL_EVAL),  # fmt: skip
    "nft_video_shapes_cpu": Run("nft_video_shapes_cpu.toml", ["rl.max_steps=5", "rl.eval.every=5", "rl.eval.per_task=2", "rl.eval.seeds=1"],
                                [], SMALL_EVAL),  # fmt: skip
    "nft_i2v_shapes_cpu": Run("nft_i2v_shapes_cpu.toml", ["rl.max_steps=5", "rl.eval.every=5", "rl.eval.per_task=2", "rl.eval.seeds=1"],
                              [], [*SMALL_EVAL, "--condition", "first_frame"]),  # fmt: skip
    "dpo_video_shapes_cpu": Run("dpo_video_shapes_cpu.toml",
                                ["rl.max_steps=20", 'rl.data.shards=["../shapes/video_pairs_small/pairs-000000.tar"]',
                                 "rl.eval.every=20", "rl.eval.per_task=2", "rl.eval.seeds=1"],
                                [_head("manifests/shapes_video_train.txt", VIDEO_PROMPTS, 24), ["cosmos_rl.cli", *VIDEO_MINE]],
                                SMALL_EVAL),  # fmt: skip
    "sft_video_shapes_cpu": Run("sft_video_shapes_cpu.toml",
                                ["rl.max_steps=20", 'rl.data.shards=["../shapes/video_small/motion-000000.tar"]',
                                 "rl.eval.every=20", "rl.eval.per_task=2", "rl.eval.seeds=1"],
                                [["cosmos_rl.shapes", *VIDEO_SHARDS]], SMALL_EVAL),  # fmt: skip
}


def _run(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env={**os.environ, **ENV}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(args)}\n{done.stderr[-4000:]}")
    return time.perf_counter() - start


def _setup(step: list[str] | Callable[[Path], None], work: Path) -> float:
    if isinstance(step, list):
        return _run(step, work)
    start = time.perf_counter()
    step(work)
    return time.perf_counter() - start


def capture(out: Path, names: list[str]) -> dict:
    """Run `names` in a scratch copy of manifests/ (the shapes data beside it) and keep their numbers in `out`."""
    work = out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "manifests").exists():
        shutil.copytree(ROOT / "manifests", work / "manifests")
    walls = {}
    for name in names:
        manifest, overrides, setup, eval_args = RUNS[name]
        for step in setup:
            walls[f"{name}/setup"] = walls.get(f"{name}/setup", 0.0) + _setup(step, work)
        run_dir = work / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        walls[f"{name}/train"] = _run(["cosmos_rl.cli", "train", f"manifests/{manifest}", *overrides], work)
        eval_dir = work / "eval" / name
        walls[f"{name}/eval"] = _run(["cosmos_rl.cli", "eval", str(run_dir), "--json", "--device", "cpu",
                                      "--out", str(eval_dir), *eval_args], work)  # fmt: skip
        keep = out / name
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(run_dir / "metrics.jsonl", keep / "metrics.jsonl")
        shutil.copy(eval_dir / "eval.json", keep / "eval.json")
    return {"captured": names, "wall_s": {k: round(v, 1) for k, v in walls.items()}}


def _wall_clock(key: str) -> bool:
    return key.startswith("time/") or (key.startswith("train/") and key.endswith("_per_s"))


def _added_since_capture(key: str) -> bool:
    """Keys the code writes beside the captured ones since the capture (new numbers, none replaced):
    the bootstrap intervals and paired differences of eval.json, its suite, and the eval/ interval metrics."""
    return key.endswith(("_interval", "_lo", "_hi")) or key.startswith("diff_") or key in ("bootstrap", "suite")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _diff_tree(a, b, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if _wall_clock(key) or key in ("target", "grid", "grid_gif"):  # where the capture ran
                continue
            if key not in a and key in b and _added_since_capture(key):
                continue
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only in {'after' if key not in a else 'before'}")
            else:
                _diff_tree(a[key], b[key], f"{where}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff_tree(x, y, f"{where}[{i}]", out)
    elif not _same(a, b):
        out.append(f"{where}: {a!r} -> {b!r}")


def compare(after: Path, before: Path) -> dict:
    """Key-by-key differences of every run both folders hold."""
    report = {}
    for name in sorted(p.name for p in before.iterdir() if (p / "metrics.jsonl").exists()):
        diffs: list[str] = []
        if not (after / name / "metrics.jsonl").exists():
            report[name] = ["missing in after"]
            continue
        rows_b, rows_a = _rows(before / name / "metrics.jsonl"), _rows(after / name / "metrics.jsonl")
        if len(rows_a) != len(rows_b):
            diffs.append(f"metrics.jsonl: {len(rows_b)} rows -> {len(rows_a)}")
        for i, (rb, ra) in enumerate(zip(rows_b, rows_a)):
            _diff_tree(rb, ra, f"metrics[{i}](step {rb.get('step')})", diffs)
        _diff_tree(json.loads((before / name / "eval.json").read_text()),
                   json.loads((after / name / "eval.json").read_text()), "eval", diffs)  # fmt: skip
        report[name] = diffs
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    cap = sub.add_parser("capture")
    cap.add_argument("out", type=Path)
    cap.add_argument("--only", nargs="*", default=list(RUNS), choices=list(RUNS))
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("after", type=Path)
    cmp_.add_argument("before", type=Path)
    args = parser.parse_args()
    if args.verb == "capture":
        print(json.dumps(capture(args.out.resolve(), args.only), indent=2))
        return
    report = compare(args.after, args.before)
    print(json.dumps({"differences": sum(len(v) for v in report.values()), "runs": report}, indent=2))
    sys.exit(1 if any(report.values()) else 0)


if __name__ == "__main__":
    main()
