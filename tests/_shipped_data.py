"""A stand-in repository root for the shipped shapes manifests: a copy of manifests/ beside the data
their header comments say to write first (git ignores shapes/, so a clean clone has none). The data
come from the same commands at a few samples each, so the manifests validate as a user's would."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

from _inproc import cosmos

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: Path) -> None:
    """`python -m MODULE ARGS` from `cwd`, run in this process: the data are the point, not the process,
    and a child would import torch again before writing a shard (tests/_inproc.py)."""
    module, *rest = args
    if module == "cosmos_rl.cli":
        done = cosmos(*rest, cwd=cwd)
        assert done.returncode == 0, done.stderr
        return
    from cosmos_rl.shapes.__main__ import main  # the documented `python -m cosmos_rl.shapes`

    assert module == "cosmos_rl.shapes", module
    said = io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
        code = main(rest)
    assert code == 0, said.getvalue()


def shipped_checkout(tmp: Path) -> Path:
    """`tmp` holding manifests/ and shapes/{sft,video,pairs,video_pairs}/ as the shapes manifests' headers write them."""
    shutil.copytree(ROOT / "manifests", tmp / "manifests")
    _run(["cosmos_rl.shapes", "shards", "shapes/sft", "--samples", "40", "--per-shard", "2"], tmp)  # sft_shapes_cpu's 20 shards
    _run(["cosmos_rl.shapes", "video-shards", "shapes/video", "--samples", "40", "--per-shard", "2"], tmp)  # sft_video_shapes_cpu's 20
    prompts = tmp / "prompts.txt"
    prompts.write_text("".join((ROOT / "manifests" / "shapes_train.txt").read_text().splitlines(keepends=True)[:8]))
    _run(["cosmos_rl.cli", "pairs", "mine", "preset:shapes", "--reward", "shapes_strict", "--prompts", str(prompts),
          "--samples", "3", "--sample-steps", "10", "--guidance", "1", "--out", "shapes/pairs", "--device", "cpu"], tmp)  # fmt: skip
    clip_prompts = tmp / "clip_prompts.txt"  # the video training prompts' first rows
    clip_prompts.write_text("".join((ROOT / "manifests" / "shapes_video_train.txt").read_text().splitlines(keepends=True)[:8]))
    _run(["cosmos_rl.cli", "pairs", "mine", "preset:shapes_video", "--frames", "9", "--reward", "shapes_video_partial",
          "--prompts", str(clip_prompts), "--samples", "3", "--sample-steps", "10", "--guidance", "1", "--per-shard", "2000",
          "--out", "shapes/video_pairs", "--device", "cpu"], tmp)  # fmt: skip  (dpo_video_shapes_cpu's clip pairs)
    return tmp
